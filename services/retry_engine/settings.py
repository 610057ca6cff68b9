"""The retry engine's settings (prefix ``HETEROFLOW_``)."""

from __future__ import annotations

from pydantic import Field

from libs.config import CommonSettings

from .decide import RetryConfig


class RetrySettings(CommonSettings):
    retry_delay: float = Field(default=30.0, ge=0, description="seconds before retry 1")
    retry_backoff_multiplier: float = Field(default=2.0, ge=1)
    retry_oom_memory_limit: int = Field(default=16384, gt=0, description="MB cap for OOM doubling")

    def config(self) -> RetryConfig:
        return RetryConfig(
            self.retry_delay, self.retry_backoff_multiplier, self.retry_oom_memory_limit
        )
