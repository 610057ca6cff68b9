"""The full event catalogue: importing this module registers every payload type."""

from __future__ import annotations

from . import events, group, job_state, lending, node, pool
from .events import PAYLOAD_TYPES, Payload, parse_payload

__all__ = [
    "PAYLOAD_TYPES",
    "Payload",
    "events",
    "group",
    "job_state",
    "lending",
    "node",
    "parse_payload",
    "pool",
]
