"""The event timeline's settings (prefix ``HETEROFLOW_``)."""

from __future__ import annotations

from pydantic import Field

from libs.config import CommonSettings


class TimelineSettings(CommonSettings):
    timeline_retention_days: float = Field(default=30.0, gt=0)
    timeline_max_per_subject: int = Field(default=200, gt=0)
    timeline_purge_interval_s: float = 3600.0
