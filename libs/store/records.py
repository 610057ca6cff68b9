"""Rows as one JSON parameter: a batch of inserts or upserts in one statement.

`executemany` sends one statement per row, and psycopg's work per statement (binding each
parameter, its pipeline bookkeeping) was the larger part of the store's CPU per command. A
batch is instead one JSON array of records, built by orjson in one pass, that PostgreSQL
spreads into rows of the target table (`jsonb_populate_recordset`): one statement, one
parameter, whatever the batch's size. Documents already JSON (a model serialised by pydantic)
are embedded as they are (`orjson.Fragment`), not parsed and written again.

Rows are inserted in the order of the array, so a `bigserial` column (the events' position)
numbers them in that order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

import orjson
from psycopg.types.json import Json, Jsonb

_OPTIONS = orjson.OPT_NON_STR_KEYS


def _json(obj: Any) -> bytes:
    """`obj` as JSON: orjson, or the standard library for what orjson refuses (an integer
    past 64 bits), so a batch accepts every value a single psycopg `Jsonb` did."""
    try:
        return orjson.dumps(obj, option=_OPTIONS)
    except orjson.JSONEncodeError:
        return json.dumps(obj).encode()


def plain(value: Any) -> Any:
    """A row value as orjson writes it: a `Jsonb` parameter becomes its JSON embedded."""
    if isinstance(value, Json | Jsonb):
        dumps = value.dumps
        text = dumps(value.obj) if dumps is not None else _json(value.obj)
        return orjson.Fragment(text)
    return value


def records(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Jsonb:
    """The rows as one jsonb parameter: an array of objects keyed by `columns`."""
    body = orjson.dumps(
        [{c: plain(v) for c, v in zip(columns, row, strict=True)} for row in rows],
        option=_OPTIONS,
    )
    return Jsonb(body, dumps=_as_is)


def _as_is(body: bytes) -> bytes:
    return body


_INSERT = re.compile(
    r"INSERT INTO (?P<table>\w+) \((?P<columns>[^)]*)\)\s*VALUES \((?:%s,\s*)*%s\)", re.S
)


def _one_row_insert(insert_sql: str) -> re.Match[str]:
    found = _INSERT.search(insert_sql)
    if found is None:
        raise ValueError(f"not a one-row INSERT … VALUES statement: {insert_sql[:80]!r}")
    return found


def columns_of(insert_sql: str) -> tuple[str, ...]:
    """The column list of an `INSERT INTO t (a, b) VALUES (%s, %s) ...` statement."""
    return tuple(c.strip() for c in _one_row_insert(insert_sql)["columns"].split(","))


def from_records(insert_sql: str) -> str:
    """The same statement over a batch: its VALUES row replaced by the rows of one jsonb
    parameter (`records`) of the table's row type; the rest (ON CONFLICT, RETURNING) kept."""
    found = _one_row_insert(insert_sql)
    table, cols = found["table"], ", ".join(columns_of(insert_sql))
    select = (
        f"INSERT INTO {table} ({cols})\n"
        f"SELECT {cols} FROM jsonb_populate_recordset(NULL::{table}, %s::jsonb)"
    )
    return insert_sql[: found.start()] + select + insert_sql[found.end() :]
