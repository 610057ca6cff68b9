"""Fixtures: a real PostgreSQL and a real NATS server (embedded binaries) for the session,
and a fresh database per test that needs one.

Markers follow from the fixtures: a test that uses a fixture starting a server is marked
`integration`, one that uses a fixture starting a platform is also `slow`, so
`-m "not integration and not slow"` cannot start a server because a mark was forgotten.
`HETEROFLOW_TEST_FORBID_SERVERS=1` makes starting one an error: the proof that such a run
starts none.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from libs.embedded import EmbeddedNats, EmbeddedPostgres

# Fixtures that start a server (or talk to the Docker engine); `item.fixturenames` is the
# closure of a test's fixtures, so `database_url`, `api` and `nats_url` count through
# `pg_server` and `nats_server`.
SERVER_FIXTURES = frozenset(
    {"pg_server", "nats_server", "cluster", "split", "up", "gateway", "deployment", "server"}
    | {"engine"}
)
# Fixtures that start a platform: `heteroflow up`, its processes, a NATS cluster, compose.
PLATFORM_FIXTURES = frozenset({"cluster", "split", "up", "gateway", "deployment"})
# Tests under this directory start servers in their bodies too (test_embedded_servers),
# where no fixture shows it: they are integration tests by where they live.
INTEGRATION_DIR = Path(__file__).parent / "integration"

FORBID_ENV = "HETEROFLOW_TEST_FORBID_SERVERS"
SERVER_BINARIES = frozenset({"nats-server", "postgres", "pg_ctl", "initdb", "docker"})


def _defined_here(item: pytest.Item, name: str) -> bool:
    """Whether the fixture `name` in effect for `item` is one of this test tree's (not a
    plugin's fixture of the same name)."""
    defs = getattr(item, "_fixtureinfo", None)
    found = defs.name2fixturedefs.get(name) if defs is not None else None
    return bool(found) and found[-1].func.__module__.startswith("tests.")  # type: ignore[index]


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: it must see the added marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = {n for n in getattr(item, "fixturenames", ()) if _defined_here(item, n)}
        in_dir = INTEGRATION_DIR in Path(str(item.path)).parents
        if (used & SERVER_FIXTURES or in_dir) and not item.get_closest_marker("integration"):
            item.add_marker(pytest.mark.integration)
        if used & PLATFORM_FIXTURES and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


def _refuse(what: str) -> None:
    raise RuntimeError(f"{FORBID_ENV} is set: this run may not start {what}")


def _guarded_popen(popen_init: Any) -> Any:
    def init(self: subprocess.Popen[Any], args: Any, *a: Any, **kw: Any) -> None:
        argv = [str(x) for x in ([args] if isinstance(args, (str, bytes)) else args)]
        first = Path(argv[0].split()[0]).name if argv else ""
        platform = ("heteroflow" in argv or first == "heteroflow") and (
            "up" in argv or "service" in argv
        )
        if first in SERVER_BINARIES or platform:
            _refuse(" ".join(argv))
        popen_init(self, args, *a, **kw)

    return init


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(FORBID_ENV) != "1":
        return
    mp = pytest.MonkeyPatch()
    mp.setattr(EmbeddedNats, "start", lambda self, *a, **k: _refuse("an embedded NATS server"))
    mp.setattr(EmbeddedPostgres, "start", lambda self, *a, **k: _refuse("an embedded PostgreSQL"))
    mp.setattr(subprocess.Popen, "__init__", _guarded_popen(subprocess.Popen.__init__))
    config.add_cleanup(mp.undo)


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
