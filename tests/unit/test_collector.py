"""The collector's setting for long-running processes (libs/collector.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from libs import collector
from libs.config import CommonSettings


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_tune_sets_the_young_generation_and_keeps_the_others() -> None:
    gc.set_threshold(700, 10, 10)
    collector.tune(10_000)
    assert gc.get_threshold() == (10_000, 10, 10)


def test_zero_means_pythons_own_threshold() -> None:
    gc.set_threshold(5, 10, 10)
    collector.tune(0)
    assert gc.get_threshold() == (collector.PYTHON_DEFAULT, 10, 10)


def test_the_setting_defaults_to_the_service_value_and_reads_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("HETEROFLOW_GC_THRESHOLD", raising=False)
    assert CommonSettings().gc_threshold == collector.SERVICE_DEFAULT
    monkeypatch.setenv("HETEROFLOW_GC_THRESHOLD", "0")
    assert CommonSettings().gc_threshold == 0
    monkeypatch.setenv("HETEROFLOW_GC_THRESHOLD", "-1")
    with pytest.raises(ValueError, match="gc_threshold"):
        CommonSettings()
