"""Fixtures: a real PostgreSQL and a real NATS server (embedded binaries) for the session,
and a fresh database per test that needs one."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from libs.embedded import EmbeddedNats, EmbeddedPostgres


@pytest.fixture(scope="session")
def hf_tmp() -> Iterator[Path]:
    # Not pytest's tmp_path: pytest prunes old base dirs, which would pull the data directory
    # from under a server of a concurrently running session.
    root = Path(tempfile.mkdtemp(prefix="hf-test-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server(hf_tmp: Path) -> Iterator[str]:
    """URL of the session's PostgreSQL; HETEROFLOW_TEST_DATABASE_URL uses an external one."""
    external = os.environ.get("HETEROFLOW_TEST_DATABASE_URL")
    if external:
        yield external
        return
    server = EmbeddedPostgres(hf_tmp / "pg").start()
    yield server.url
    server.stop()


@pytest.fixture
def database_url(pg_server: str) -> Iterator[str]:
    """A new, empty database for one test, dropped afterwards."""
    name = "hf_" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    params = conninfo_to_dict(pg_server)
    params["dbname"] = name
    yield make_conninfo("", **params)
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def nats_server(hf_tmp: Path) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(hf_tmp / "nats").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def nats_url(nats_server: EmbeddedNats) -> str:
    return os.environ.get("HETEROFLOW_TEST_NATS_URL") or nats_server.url
