"""The shape of the code, checked: dependencies point down and SQL has one home.

* `libs/` is what everything shares: it imports no service, no agent and not the application
  package (`heteroflow/`, the wiring and the CLIs).
* A service imports no other service and not the agent; the agent imports no service.
* `libs/domain` is pure: no I/O library (asyncio, nats, psycopg, docker, pynvml, faststream).
* The scheduler's placement core (`services/scheduler/placement`) is pure too: the standard
  library, the domain and itself; no store, bus, logging or metrics.
* SQL lives in `libs/store` only: every table has one owner module there.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("libs", "services", "agent", "heteroflow")


def _modules(package: str) -> Iterator[Path]:
    yield from sorted((ROOT / package).rglob("*.py"))


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in a file, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            yield node.lineno, name
            for alias in node.names:  # `from services import scheduler`
                yield node.lineno, f"{name}.{alias.name}"


def _top(name: str, depth: int = 1) -> str:
    return ".".join(name.split(".")[:depth])


def _service_of(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if parts[0] == "services" and len(parts) > 1 else None


def _violations() -> list[str]:
    found: list[str] = []
    for package in PACKAGES:
        for path in _modules(package):
            rel = path.relative_to(ROOT)
            own_service = _service_of(".".join(rel.with_suffix("").parts))
            for line, name in _imports(path):
                top = _top(name)
                where = f"{rel}:{line} imports {name}"
                if package == "libs" and top in ("services", "agent", "heteroflow"):
                    found.append(where)
                elif package == "services":
                    other = _service_of(name)
                    if top in ("agent", "heteroflow") or (other and other != own_service):
                        found.append(where)
                elif package == "agent" and top in ("services", "heteroflow"):
                    found.append(where)
    return found


def test_dependencies_point_down() -> None:
    assert _violations() == []


IO_LIBRARIES = {"asyncio", "nats", "psycopg", "psycopg_pool", "docker", "pynvml", "faststream"}


def test_the_domain_does_no_io() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in _modules("libs/domain")
        for line, name in _imports(path)
        if _top(name) in IO_LIBRARIES
    ]
    assert found == []


PLACEMENT = "services/scheduler/placement"


def _impure_placement_imports() -> list[str]:
    """The placement core's imports of anything but the standard library's pure modules, the
    domain and the core itself: it reads a snapshot and returns a plan, nothing more."""
    own = PLACEMENT.replace("/", ".")
    found = []
    for path in _modules(PLACEMENT):
        for line, name in _imports(path):
            top = _top(name)
            impure = (
                top in IO_LIBRARIES
                or top in ("agent", "heteroflow", "prometheus_client", "structlog")
                or (top == "libs" and _top(name, 2) != "libs.domain")
                or (top == "services" and not (name == own or name.startswith(own + ".")))
            )
            if impure:
                found.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return found


def test_the_placement_core_does_no_io() -> None:
    assert _impure_placement_imports() == []


@pytest.mark.parametrize(
    "source",
    [
        "import asyncio\n",
        "from libs.store import tasks\n",
        "from libs.bus.broker import Routes\n",
        "from services.scheduler import view\n",
        "from .. import view\n",
        "import structlog\n",
    ],
    ids=["asyncio", "store", "bus", "scheduler-view", "relative-view", "logging"],
)
def test_the_placement_check_catches_an_io_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    target = tmp_path / PLACEMENT / "x.py"
    target.parent.mkdir(parents=True)
    target.write_text(source)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    found = _impure_placement_imports()
    assert found and all(f.startswith(f"{PLACEMENT}/x.py:1 imports ") for f in found)


# A string that reads as a statement: the verbs that start SQL, followed by what they act on.
SQL = re.compile(
    r"^\s*(SELECT\s.+\sFROM\s|INSERT\s+INTO\s|UPDATE\s+\w+\s+SET\s|DELETE\s+FROM\s|"
    r"CREATE\s+(TABLE|INDEX|UNIQUE)|ALTER\s+TABLE\s|WITH\s+\w+\s+AS\s*\(|SELECT\s+\w+\()",
    re.IGNORECASE | re.DOTALL,
)


def _sql_strings(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if SQL.match(node.value):
                yield node.lineno, node.value.strip().splitlines()[0][:60]
        elif isinstance(node, ast.JoinedStr):
            text = "".join(
                v.value
                for v in node.values
                if isinstance(v, ast.Constant) and isinstance(v.value, str)
            )
            if SQL.match(text):
                yield node.lineno, text.strip().splitlines()[0][:60]


def test_sql_lives_only_in_the_store() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text}"
        for package in PACKAGES
        for path in _modules(package)
        if not path.is_relative_to(ROOT / "libs" / "store")
        for line, text in _sql_strings(path)
    ]
    assert found == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("libs/x.py", "import services.scheduler.view\n"),
        ("libs/x.py", "from agent.service import Agent\n"),
        ("libs/x.py", "from heteroflow.platform import serve\n"),
        ("services/scheduler/x.py", "from services.retry_engine import decide\n"),
        ("services/scheduler/x.py", "from services import retry_engine\n"),
        ("agent/x.py", "from services.scheduler import view\n"),
    ],
    ids=[
        "libs->service",
        "libs->agent",
        "libs->app",
        "service->service",
        "from-services",
        "agent->service",
    ],
)
def test_the_checks_catch_a_bad_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, expected: str
) -> None:
    """The rules above are only worth having if a new bad import turns them red."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    target = tmp_path / source
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(expected)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    found = _violations()
    assert found and all(v.startswith(source) for v in found)


def test_the_sql_check_catches_a_query(tmp_path: Path) -> None:
    path = tmp_path / "x.py"
    path.write_text(
        'Q = """\n    SELECT id, version\n    FROM nodes WHERE id = %s"""\nOK = "select a node"\n'
    )
    assert [line for line, _ in _sql_strings(path)] == [1]
