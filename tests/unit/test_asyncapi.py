"""The committed AsyncAPI document is what FastStream generates from the code's subscribers
and publishers (regenerate with `just asyncapi`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heteroflow.asyncapi import all_routes, render
from libs.bus.broker import Routes
from libs.domain.catalog import PAYLOAD_TYPES

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "asyncapi.json"


def _doc() -> dict[str, object]:
    return json.loads(COMMITTED.read_text())  # type: ignore[no-any-return]


def test_committed_asyncapi_matches_code() -> None:
    assert COMMITTED.read_text() == render(), "docs/asyncapi.json is stale: run `just asyncapi`"


@pytest.mark.parametrize(
    "address",
    [
        "hf.node.{node_id}.cmd",
        "hf.node.{node_id}.report",
        "hf.node.{node_id}.heartbeat",
        "hf.node.{node_id}.logs",
        "hf.node.{node_id}.telemetry",
        "hf.events.task.{task_id}.task_status_changed",
        "hf.events.{stream_type}.{stream_id}.{event_type}",
    ],
)
def test_every_platform_subject_is_documented(address: str) -> None:
    channels = _doc()["channels"]
    assert isinstance(channels, dict)
    assert address in {c["address"] for c in channels.values()}


def test_a_new_subscriber_changes_the_document() -> None:
    """The comparison above can fail: declaring one more subject changes what is generated."""
    from faststream.specification import AsyncAPI

    from libs.bus.broker import broker_for
    from libs.domain.protocol import Heartbeat

    async def unused(_: Heartbeat) -> None:
        raise AssertionError

    extra = Routes("test")
    extra.core(Heartbeat, unused, subject="hf.node.{node_id}.undocumented", description="x")
    spec = AsyncAPI(broker_for(None, [*all_routes(), extra]), schema_version="3.0.0")
    doc = json.loads(spec.to_specification().to_json())
    addresses = {c["address"] for c in doc["channels"].values()}
    assert "hf.node.{node_id}.undocumented" in addresses


def test_event_payloads_are_in_the_document() -> None:
    schemas = _doc()["components"]
    assert isinstance(schemas, dict)
    assert {cls.__name__ for cls in PAYLOAD_TYPES.values()} <= set(schemas["schemas"])
    assert "EventEnvelope" in schemas["schemas"]
