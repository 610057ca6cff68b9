"""The full event catalogue: importing this module registers every payload type."""

from __future__ import annotations

from libs.domain.group import events as group_events
from libs.domain.job import events as job_events
from libs.domain.node import events as node_events
from libs.domain.payload import PAYLOAD_TYPES, Payload, parse_payload
from libs.domain.pool import events as pool_events
from libs.domain.rollout import events as rollout_events
from libs.domain.task import events as task_events
from libs.domain.task import lending
from libs.domain.tenant import events as tenant_events

__all__ = [
    "PAYLOAD_TYPES",
    "Payload",
    "group_events",
    "job_events",
    "lending",
    "node_events",
    "parse_payload",
    "pool_events",
    "rollout_events",
    "task_events",
    "tenant_events",
]
