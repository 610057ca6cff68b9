"""The agent's second look at a start command (agent/recheck.py), table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from agent.recheck import refusal
from agent.runtimes.base import RunSpec

ALLOW = ["/data", "/tmp/heteroflow"]


def run(**kw: Any) -> RunSpec:
    return RunSpec.model_validate({"task_id": "t1", "attempt": 0, "image": "busybox"} | kw)


def vol(host: str, container: str = "/work") -> dict[str, Any]:
    return {"host_path": host, "container_path": container}


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({}, None),
        ({"image": ""}, None),
        ({"volumes": [vol("/data/set")]}, None),
        ({"volumes": [vol("/etc")]}, "volumes[0].host_path '/etc' is not under"),
        ({"volumes": [vol("/data/../etc")]}, "is not under"),
        ({"volumes": [vol("/datax")]}, "is not under"),
        ({"volumes": [vol("/data", "/proc")]}, "volumes[0]: container_path must not be /proc"),
        ({"volumes": [vol("/data", "/")]}, "must not be /"),
        ({"volumes": [vol("/data", "rel")]}, "must be absolute"),
        ({"image": "busybox;rm -rf / #"}, "image "),
        ({"env": {"HETEROFLOW_TASK_ID": "x"}}, "env keys reserved"),
    ],
    ids=[
        "plain",
        "no-image",
        "allowed-volume",
        "host-outside",
        "dotdot",
        "prefix-trick",
        "proc",
        "root",
        "relative",
        "bad-image",
        "reserved-env",
    ],
)
def test_refusal(kw: dict[str, Any], why: str | None) -> None:
    got = refusal(run(**kw), ALLOW)
    if why is None:
        assert got is None
    else:
        assert got is not None and why in got


def test_an_empty_allow_list_refuses_every_volume() -> None:
    assert "none configured" in (refusal(run(volumes=[vol("/data")]), []) or "")
