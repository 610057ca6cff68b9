"""Foreign references: one aggregate naming another it does not own (docs/security.md).

A task that claims a job node, a group or a loan it was not created for, or telemetry an
agent sends for a task placed on another node, is never applied: the service that meets it
calls `refuse_foreign`, which logs it and counts it by kind.
"""

from __future__ import annotations

from typing import Any

import structlog
from prometheus_client import Counter

log = structlog.get_logger(__name__)

FOREIGN_REFERENCES = Counter(
    "heteroflow_foreign_references_total",
    "References to an aggregate the sender does not own, refused and not applied",
    ["kind"],
)


def refuse_foreign(kind: str, why: str, *, count: int = 1, **fields: Any) -> None:
    """Log and count refused references (`kind`: job_task, group_member, telemetry)."""
    FOREIGN_REFERENCES.labels(kind).inc(count)
    log.warning("foreign_reference_refused", kind=kind, why=why, count=count, **fields)
