"""Rows as one JSON parameter (libs/store/records.py): the statement rewrite and the records."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from libs.store.eventstore import INSERT_EVENT, INSERT_EVENTS, INSERT_EVENTS_NO_RETURN
from libs.store.projections import AGGREGATES, as_jsonb
from libs.store.records import columns_of, from_records, records


class Doc(BaseModel):
    at: datetime
    note: str


def test_the_values_row_becomes_the_rows_of_one_parameter_and_the_rest_is_kept() -> None:
    sql = "INSERT INTO t (a, b)\nVALUES (%s, %s)\nON CONFLICT (a) DO UPDATE SET b = EXCLUDED.b"
    out = from_records(sql)
    assert out.startswith(
        "INSERT INTO t (a, b)\nSELECT a, b FROM jsonb_populate_recordset(NULL::t, %s::jsonb)"
    )
    assert out.endswith("ON CONFLICT (a) DO UPDATE SET b = EXCLUDED.b")
    assert out.count("%s") == 1
    assert "RETURNING position" in INSERT_EVENTS
    assert "RETURNING" not in INSERT_EVENTS_NO_RETURN
    assert columns_of(INSERT_EVENT)[0] == "event_id"


def test_every_projection_has_a_batch_statement_over_its_own_columns() -> None:
    for agg in AGGREGATES.values():
        assert agg.columns == columns_of(agg.upsert_sql)
        assert f"NULL::{agg.table}" in agg.batch_sql
        assert agg.batch_sql.count("%s") == 1


def test_a_statement_that_is_not_a_one_row_insert_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="not a one-row INSERT"):
        from_records("UPDATE t SET a = %s")


def _body(param: Jsonb) -> list[dict[str, object]]:
    assert param.dumps is not None
    raw = param.dumps(param.obj)
    return json.loads(raw)  # type: ignore[no-any-return]


def test_records_embed_documents_as_pydantic_wrote_them_and_keep_every_value() -> None:
    at = datetime(2026, 12, 3, 10, 0, 0, 123456, tzinfo=UTC)
    doc = Doc(at=at, note="naïve — ✓")
    eid = uuid.uuid4()
    big = 2**70  # past orjson's 64 bits: the standard library writes it
    body = _body(
        records(
            ("id", "doc", "meta", "labels", "at", "gone"),
            [(eid, as_jsonb(doc), Jsonb({"n": big, 3: "k"}), Jsonb({"a": "b"}), at, None)],
        )
    )
    assert body == [
        {
            "id": str(eid),
            "doc": json.loads(doc.model_dump_json()),
            "meta": {"n": big, "3": "k"},
            "labels": {"a": "b"},
            "at": "2026-12-03T10:00:00.123456+00:00",
            "gone": None,
        }
    ]


def test_records_keep_the_rows_order() -> None:
    body = _body(records(("n",), [(i,) for i in range(50)]))
    assert [r["n"] for r in body] == list(range(50))
