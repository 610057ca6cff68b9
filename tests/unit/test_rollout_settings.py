"""The rollout process's lease settings reach the policy the controller decides with."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from services.rollout.settings import RolloutSettings


def test_the_lease_ttl_and_renewal_are_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HETEROFLOW_ROLLOUT_LEASE_TTL_S", "20")
    monkeypatch.setenv("HETEROFLOW_ROLLOUT_LEASE_RENEW_S", "4")
    policy = RolloutSettings().policy()
    assert policy.lease_ttl == timedelta(seconds=20)
    assert policy.lease_renew == timedelta(seconds=4)
    defaults = RolloutSettings.model_fields
    assert defaults["rollout_lease_ttl_s"].default == 60.0  # seed 000
    assert defaults["rollout_lease_renew_s"].default == 15.0


def test_a_renewal_not_shorter_than_the_ttl_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETEROFLOW_ROLLOUT_LEASE_TTL_S", "10")
    monkeypatch.setenv("HETEROFLOW_ROLLOUT_LEASE_RENEW_S", "10")
    with pytest.raises(
        ValidationError, match="must be shorter than HETEROFLOW_ROLLOUT_LEASE_TTL_S"
    ):
        RolloutSettings()
