"""Global `max_retries` and `retry_strategy` are settings; a task's own value overrides them."""

from __future__ import annotations

import pytest

from libs.config import GatewaySettings
from libs.domain.group.model import parse_group
from libs.domain.job.spec import parse_job
from libs.domain.task.model import RetryStrategy, parse_create

BODY = {"name": "x", "image": "busybox"}


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETEROFLOW_RETRY_MAX_RETRIES", "7")
    monkeypatch.setenv("HETEROFLOW_RETRY_DEFAULT_STRATEGY", "retry_same_node")
    assert GatewaySettings().task_defaults() == {
        "max_retries": 7,
        "retry_strategy": "retry_same_node",
    }


def test_defaults_without_settings_are_the_seed_values() -> None:
    assert GatewaySettings().task_defaults() == {
        "max_retries": 3,
        "retry_strategy": "retry_new_node",
    }


DEFAULTS = {"max_retries": 7, "retry_strategy": "no_retry"}


def test_a_task_that_names_none_gets_the_configured_values() -> None:
    spec = parse_create(BODY, tenant=True, defaults=DEFAULTS)
    assert spec.max_retries == 7 and spec.retry_strategy is RetryStrategy.NO_RETRY


def test_a_task_value_overrides_the_setting() -> None:
    body = BODY | {"max_retries": 0, "retry_strategy": "retry_new_node"}
    spec = parse_create(body, tenant=True, defaults=DEFAULTS)
    assert spec.max_retries == 0 and spec.retry_strategy is RetryStrategy.RETRY_NEW_NODE


def test_groups_and_jobs_get_them_too() -> None:
    group = parse_group(BODY | {"task_count": 2}, tenant=True, defaults=DEFAULTS)
    assert group.member_spec(1).max_retries == 7
    job = parse_job(
        {"name": "j", "tasks": [BODY | {"key": "a"}, BODY | {"key": "b", "max_retries": 1}]},
        tenant=True,
        defaults=DEFAULTS,
    )
    assert [n.spec.max_retries for n in job.tasks] == [7, 1]


def test_a_bad_setting_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETEROFLOW_RETRY_DEFAULT_STRATEGY", "sometimes")
    with pytest.raises(ValueError):
        GatewaySettings()
