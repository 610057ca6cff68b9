"""The autoscaler process's settings (`HETEROFLOW_AUTOSCALE_*`, `HETEROFLOW_WINDOW_*`,
`HETEROFLOW_IDLE_SLEEP_*`; docs/autoscaling.md, docs/serving.md)."""

from __future__ import annotations

import uuid

from pydantic import Field

from libs.config import CommonSettings
from libs.domain.group.autoscale import DRAIN_LIMIT_S, MIN_REPLICA_AGE_S


class AutoscalerSettings(CommonSettings):
    window_interval_s: float = Field(
        default=60.0, gt=0, description="schedule-window evaluation period"
    )
    autoscale_interval_s: float = Field(
        default=30.0, gt=0, description="AutoScaler evaluation period"
    )
    autoscale_metric_max_age_s: float = Field(
        default=30.0,
        gt=0,
        description="a gateway's router figures older than this no longer count",
    )
    autoscale_utilization_window_s: float = Field(
        default=60.0, gt=0, description="gpu_utilization: mean over the samples of this window"
    )
    autoscale_min_replica_age_s: float = Field(
        default=MIN_REPLICA_AGE_S, ge=0, description="a scale-down never removes a younger replica"
    )
    autoscale_drain_limit_s: float = Field(
        default=DRAIN_LIMIT_S, gt=0, description="a replica draining longer than this is ended"
    )
    idle_sleep_interval_s: float = Field(
        default=1.0, gt=0, description="idle-sleep controller evaluation period"
    )
    idle_sleep_listen_s: float = Field(
        default=10.0,
        ge=0,
        description="the idle-sleep controller hears the routers this long before it first "
        "sleeps a target (two of their 5 s publishing intervals)",
    )
    serve_idle_minute_s: float = Field(
        default=60.0, gt=0, description="seconds in one minute of idle_timeout_minutes (tests)"
    )
    instance_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:8])
