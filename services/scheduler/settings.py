"""The scheduler's settings (prefix ``HETEROFLOW_``)."""

from __future__ import annotations

import uuid

from pydantic import Field

from libs.config import CommonSettings

from .handlers.reports import DEFAULT_MIN_RELEASED_FRACTION
from .placement.planner import DEFAULT_MAX_CANDIDATES

# Twice the agent's default HETEROFLOW_AGENT_MAX_CONCURRENT_COMMANDS (32): the agent always
# has its next commands queued, and a burst is not committed whole to one node.
DEFAULT_MAX_STARTING_PER_NODE = 64


class SchedulerSettings(CommonSettings):
    node_offline_after_s: float = Field(default=10.0, description="heartbeat silence → offline")
    node_gone_after_s: float = Field(default=600.0, description="offline this long → gone")
    task_unconfirmed_after_s: float = Field(
        default=300.0, gt=0, description="a task its node has not listed this long is resolved"
    )
    schedule_batch: int = 512
    schedule_max_candidates: int = Field(
        default=DEFAULT_MAX_CANDIDATES, ge=0, description="fits scored per task; 0 = all"
    )
    schedule_max_starting_per_node: int = Field(
        default=DEFAULT_MAX_STARTING_PER_NODE,
        ge=0,
        description="tasks scheduled or starting (not yet running) on one node; 0 = no bound",
    )
    quarantine_probes: int = Field(
        default=3,
        ge=1,
        description="health probes a quarantined card must pass in a row to be placeable again",
    )
    quarantine_probe_interval_s: float = Field(
        default=60.0, gt=0, description="seconds between two probes of a quarantined card"
    )
    group_scan_interval_s: float = 2.0
    liveness_floor_s: float = Field(
        default=900.0, gt=0, description="inference task with no positive liveness this long"
    )
    liveness_stale_s: float = Field(
        default=30.0, gt=0, description="heartbeat evidence older than this is a death signal"
    )
    group_rebuild_scan_s: float = Field(default=10.0, description="inference rebuild scan")
    group_restart_backoffs_s: list[float] = Field(default_factory=lambda: [60.0, 180.0])
    group_restart_window_s: float = 600.0
    group_restart_give_up_s: float = 1800.0
    group_max_rebuilds: int = 5
    group_replica_max_restarts: int = Field(
        default=5, ge=0, description="replica self-heals per rank within the crash window"
    )
    group_replica_crash_window_s: float = Field(
        default=600.0, gt=0, description="failures of a rank counted for the crash-loop cap"
    )
    group_replica_backoff_s: float = Field(
        default=10.0, ge=0, description="wait before the 2nd replacement, doubling after"
    )
    group_replica_backoff_max_s: float = Field(default=300.0, ge=0, description="backoff cap")
    lend_min_released_fraction: float = Field(
        default=DEFAULT_MIN_RELEASED_FRACTION,
        gt=0,
        le=1,
        description="share of its cards' memory a sleep must release for them to be lent",
    )
    instance_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:8])
