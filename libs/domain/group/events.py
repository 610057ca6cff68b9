"""Group events (stream `group-<id>`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from libs.domain.group.model import GroupSpec, GroupStatus
from libs.domain.payload import Payload, ReasonedPayload, register
from libs.domain.task.model import TenantId

# --- events ----------------------------------------------------------------------------


class GroupCreated(Payload):
    """A task group with its member template and shape (members are created with it)."""

    type: ClassVar[str] = "group_created"
    stream_type: ClassVar[str] = "group"

    group_id: str
    tenant_id: TenantId
    spec: GroupSpec


class GroupStatusChanged(ReasonedPayload):
    """The aggregated group status changed."""

    type: ClassVar[str] = "group_status_changed"
    stream_type: ClassVar[str] = "group"

    group_id: str
    from_status: GroupStatus
    to_status: GroupStatus


class GroupRecovery(ReasonedPayload):
    """A fault-tolerance action on the group: restart, rebuild or replica replacement."""

    type: ClassVar[str] = "group_recovery"
    stream_type: ClassVar[str] = "group"

    group_id: str
    kind: str  # group_restart | inference_rebuild | replica_replaced | restart_scheduled
    ranks: tuple[int, ...] = ()
    task_ids: tuple[str, ...] = ()
    due_at: datetime | None = None


class GroupConfigUpdated(Payload):
    """Group-level configuration changed (idle_timeout_minutes)."""

    type: ClassVar[str] = "group_config_updated"
    stream_type: ClassVar[str] = "group"

    group_id: str
    changes: dict[str, Any]


class GroupScaled(ReasonedPayload):
    """The group's replica count changed (manual scale, AutoScaler, schedule window)."""

    type: ClassVar[str] = "group_scaled"
    stream_type: ClassVar[str] = "group"

    group_id: str
    from_replicas: int
    to_replicas: int
    source: str = "user"  # user | autoscaler | schedule_window
    added_ranks: tuple[int, ...] = ()
    removed_task_ids: tuple[str, ...] = ()


class GroupWindowApplied(ReasonedPayload):
    """A schedule window's action (pause, scale, stop) or its restore; the labels keep the
    action in force and the replica count to restore, so a controller restart loses nothing."""

    type: ClassVar[str] = "group_window_applied"
    stream_type: ClassVar[str] = "group"

    group_id: str
    action: str  # pause | scale | stop | restore
    labels: dict[str, str]


class GroupDeleted(Payload):
    """The group and its members were deleted."""

    type: ClassVar[str] = "group_deleted"
    stream_type: ClassVar[str] = "group"

    group_id: str


register(
    GroupCreated,
    GroupStatusChanged,
    GroupRecovery,
    GroupConfigUpdated,
    GroupScaled,
    GroupWindowApplied,
    GroupDeleted,
)
