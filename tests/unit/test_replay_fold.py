"""Replay's fold against the live path, row by row after every event of 100k generated ones.

The live path is what the append transaction does: the payload model as the writer made it
(or as a loader upcasts an old one), the aggregate's `evolve`, the projection's `row`. The
fold gets only what the store holds (the payload's JSON text, the time, the version). After
each event the row of the stream it touched must be the same, column by column, the JSON
columns compared as parsed documents (as the SQL comparison of replay compares jsonb).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from libs.store.projections import AGGREGATES
from libs.store.replay_fold import ReplayFold

from .replay_events import Event, generate

EVENTS = 100_000

# Every payload type an aggregate projection folds, plus the SQL-projected kinds.
EXPECTED_KINDS = {
    "task_created",
    "task_status_changed",
    "task_retry_decided",
    "task_config_updated",
    "task_pending_reason",
    "task_drain_marked",
    "task_deleted",
    "node_registered",
    "node_offline",
    "gpu_lost",
    "gpu_recovered",
    "card_quarantined",
    "card_restored",
    "group_created",
    "group_status_changed",
    "group_scaled",
    "group_deleted",
    "job_submitted",
    "job_tasks_ready",
    "job_status_changed",
    "job_node_settled",
    "pool_created",
    "pool_updated",
    "pool_deleted",
    "queue_created",
    "queue_updated",
    "tenant_created",
    "tenant_updated",
    "api_key_issued",
    "system_credential_issued",
    "join_token_issued",
    "node_joined",
}


def _doc(value: Any) -> Any:
    """A JSON column as a parsed document: a `Jsonb` parameter or JSON text."""
    if isinstance(value, Jsonb):
        obj = value.obj
        text = value.dumps(obj) if value.dumps else json.dumps(obj)
        return orjson.loads(text)
    if isinstance(value, BaseModel):
        return orjson.loads(value.model_dump_json())
    return orjson.loads(value)


def _parsed(row: Sequence[Any], json_cols: set[int]) -> list[Any]:
    return [_doc(v) if i in json_cols else v for i, v in enumerate(row)]


def _json_cols(live_row: Sequence[Any]) -> set[int]:
    return {i for i, v in enumerate(live_row) if isinstance(v, Jsonb)}


def _where(live: list[Any], folded: list[Any]) -> str:
    for i, (a, b) in enumerate(zip(live, folded, strict=True)):
        if a != b:
            if isinstance(a, dict) and isinstance(b, dict):
                keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
                live_values = [a.get(k) for k in keys]
                return (
                    f"column {i}, keys {keys}: live {live_values}, fold {[b.get(k) for k in keys]}"
                )
            return f"column {i}: live {a!r}, fold {b!r}"
    return "equal"


def _check(events: list[Event]) -> None:
    fold = ReplayFold()
    live: dict[str, Any] = {}
    types: dict[str, str] = {}
    for n, ev in enumerate(events):
        text = json.dumps(ev.stored)
        folded = fold.apply(ev.stream_id, ev.stream_type, ev.version, ev.type, text, ev.at)
        agg = AGGREGATES.get(ev.stream_type)
        assert folded == (agg is not None), f"event {n} ({ev.type}): aggregate or not"
        if agg is None:
            continue  # tenants, keys, credentials, join tokens: projected with SQL
        live[ev.stream_id] = agg.evolve(live.get(ev.stream_id), ev.payload, ev.at, ev.version)
        types[ev.stream_id] = ev.stream_type
        want = agg.row(live[ev.stream_id])
        cols = _json_cols(want)
        a, b = _parsed(want, cols), _parsed(fold.row(ev.stream_type, ev.stream_id), cols)
        assert a == b, f"event {n} ({ev.type} v{ev.version} of {ev.stream_id}): {_where(a, b)}"
    _check_tables(fold, live, types)


def _check_tables(fold: ReplayFold, live: dict[str, Any], types: dict[str, str]) -> None:
    """What replay writes with COPY: every table's rows, each once, as the live rows."""
    written = dict(fold.tables())
    for stream_type, agg in AGGREGATES.items():
        want = [agg.row(s) for sid, s in live.items() if types[sid] == stream_type]
        got = list(written[agg.table])
        assert len(got) == len(want), f"table {agg.table}: {len(got)} rows, live {len(want)}"
        if want:
            cols = _json_cols(want[0])
            assert sorted((_parsed(r, cols) for r in got), key=_key) == sorted(
                (_parsed(r, cols) for r in want), key=_key
            ), f"table {agg.table}"


def _key(row: list[Any]) -> str:
    return str(row[0])


@pytest.fixture(scope="module")
def events() -> list[Event]:
    return generate(EVENTS)


def test_the_generated_store_holds_every_kind_in_a_realistic_mix(events: list[Event]) -> None:
    assert len(events) >= EVENTS
    assert {e.type for e in events} >= EXPECTED_KINDS
    tasks = sum(e.stream_type == "task" for e in events)
    assert tasks / len(events) > 0.9  # tasks dominate a real store
    legacy = sum(e.stored.get("schema_version") == 1 and "reason" in e.stored for e in events)
    assert legacy > 100  # version-1 payloads, upcast on load


@pytest.mark.slow  # about 10 s on the 2-core machine
def test_the_fold_equals_the_live_projections_after_every_event(events: list[Event]) -> None:
    _check(events)
