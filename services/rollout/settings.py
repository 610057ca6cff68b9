"""The rollout process's settings (`HETEROFLOW_ROLLOUT_*`, docs/rollout.md); the defaults
are the seed's numbers."""

from __future__ import annotations

import uuid
from datetime import timedelta

from pydantic import Field, model_validator

from libs.config import CommonSettings
from libs.domain.rollout.plan import RolloutPolicy


class RolloutSettings(CommonSettings):
    rollout_interval_s: float = Field(default=1.0, gt=0, description="rollout controller pass")
    rollout_batch_retries: int = Field(
        default=3, ge=0, le=10, description="times a failed batch is tried again"
    )
    rollout_drain_timeout_s: float = Field(
        default=15.0, ge=0, description="longest wait for a draining replica's requests"
    )
    rollout_drain_min_s: float = Field(
        default=2.0, ge=0, description="least wait before a drained replica is ended"
    )
    rollout_lease_renew_s: float = Field(
        default=15.0, gt=0, description="how often the group's rollout lease is renewed"
    )
    rollout_lease_ttl_s: float = Field(
        default=60.0,
        gt=0,
        description="a group's rollout lease not renewed this long has expired: the leading "
        "controller takes it over and fails the rollout (its holder crashed)",
    )
    instance_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:8])

    @model_validator(mode="after")
    def _renewed_within_the_ttl(self) -> RolloutSettings:
        if self.rollout_lease_renew_s >= self.rollout_lease_ttl_s:
            raise ValueError(
                f"HETEROFLOW_ROLLOUT_LEASE_RENEW_S ({self.rollout_lease_renew_s:g}) must be "
                f"shorter than HETEROFLOW_ROLLOUT_LEASE_TTL_S ({self.rollout_lease_ttl_s:g}): "
                "a live holder's lease would expire between two renewals"
            )
        return self

    def policy(self) -> RolloutPolicy:
        return RolloutPolicy(
            batch_retries=self.rollout_batch_retries,
            drain_timeout=timedelta(seconds=self.rollout_drain_timeout_s),
            drain_min=timedelta(seconds=self.rollout_drain_min_s),
            lease_renew=timedelta(seconds=self.rollout_lease_renew_s),
            lease_ttl=timedelta(seconds=self.rollout_lease_ttl_s),
        )
