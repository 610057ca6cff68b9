"""The shape of the code, checked: dependencies point down and SQL has one home.

* `libs/` is what everything shares: it imports no service, no agent and not the application
  package (`heteroflow/`, the wiring and the CLIs).
* A service imports no other service and not the agent; the agent imports no service.
* `libs/domain` is pure: no I/O library (asyncio, nats, psycopg, docker, pynvml, faststream).
* The scheduler's placement core (`services/scheduler/placement`) is pure too: the standard
  library, the domain and itself; no store, bus, logging or metrics.
* SQL lives in `libs/store` only: every table has one owner module there.
* The placement core (`services/scheduler/placement/`) does no I/O.
* A consumer receives its payload's model: no handler takes a payload dict, no code of a
  service or the agent indexes `.payload`.
* Services are listed once, in `heteroflow/services.py`: every package under `services/` is
  in it, and no other module holds a literal collection of two or more service names.
"""

from __future__ import annotations

import ast
import importlib
import re
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from heteroflow.services import SERVICES, by_name, names, nats_users
from libs.domain.envelope import EventEnvelope
from libs.domain.payload import Payload

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


# The one reach across services: the gateway's plan and "why pending" answers run the
# scheduler's own projection reader and pure placement core, read-only
# (services/api_gateway/planning.py), so a plan and a placement cannot disagree.
READ_ONLY_REUSE: dict[str, tuple[str, ...]] = {
    "api_gateway": ("services.scheduler.view", "services.scheduler.placement"),
}


def _reused(own: str | None, name: str) -> bool:
    allowed = READ_ONLY_REUSE.get(own or "", ())
    parents = {a.rsplit(".", 1)[0] for a in allowed}  # `from services.scheduler import view`
    return name in parents or any(name == a or name.startswith(a + ".") for a in allowed)


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
                    crosses = other and other != own_service and not _reused(own_service, name)
                    if top in ("agent", "heteroflow") or crosses:
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


# --- consumers receive payload models --------------------------------------------------------


def _payload_dict_reads(path: Path) -> Iterator[tuple[int, str]]:
    """(line, code) of each `x.payload[...]` or `x.payload.get(...)` in a file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        target: ast.expr | None = None
        if isinstance(node, ast.Subscript):
            target = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
        ):
            target = node.func.value
        if isinstance(target, ast.Attribute) and target.attr == "payload":
            yield getattr(node, "lineno", 0), ast.unparse(node)[:80]


def test_no_consumer_indexes_a_payload_dict() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {code}"
        for package in ("services", "agent")
        for path in _modules(package)
        for line, code in _payload_dict_reads(path)
    ]
    assert found == []


def _handler_modules() -> list[str]:
    return [
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in sorted((ROOT / "services").glob("*/handlers/*.py"))
        if p.name != "__init__.py"
    ]


def _event_handlers(module: Any) -> Iterator[tuple[str, Any]]:
    """(name, function) of every function or method in `module` whose first parameter (after
    `self`) is an `EventEnvelope`: an event handler."""
    for name, value in vars(module).items():
        if getattr(value, "__module__", None) != module.__name__:
            continue
        candidates = [(name, value)] if callable(value) and not isinstance(value, type) else []
        if isinstance(value, type):
            candidates = [(f"{name}.{k}", v) for k, v in vars(value).items() if callable(v)]
        for qual, fn in candidates:
            try:
                hints = typing.get_type_hints(fn)
            except Exception:  # not an annotated function
                continue
            params = [p for p in fn.__code__.co_varnames[: fn.__code__.co_argcount] if p != "self"]
            if params and hints.get(params[0]) is EventEnvelope:
                yield qual, fn


def _is_dict(annotation: Any) -> bool:
    origin = typing.get_origin(annotation) or annotation
    return origin is Any or (isinstance(origin, type) and issubclass(origin, dict | Mapping))


def _payload_params(fn: Any) -> list[tuple[str, Any]]:
    """(name, annotation) of the parameters of an event handler after its envelope."""
    hints = typing.get_type_hints(fn)
    params = [p for p in fn.__code__.co_varnames[: fn.__code__.co_argcount] if p != "self"]
    return [(p, hints.get(p)) for p in params[1:]]


def _dict_payload_handlers(module: Any) -> list[str]:
    """Event handlers of `module` that take the payload as a dict (or untyped)."""
    return [
        f"{module.__name__}.{qual}: {name} is {annotation!r}"
        for qual, fn in _event_handlers(module)
        for name, annotation in _payload_params(fn)
        if annotation is None or _is_dict(annotation)
    ]


def _typed_handlers(module: Any) -> list[str]:
    return [
        qual
        for qual, fn in _event_handlers(module)
        if any(isinstance(a, type) and issubclass(a, Payload) for _, a in _payload_params(fn))
    ]


def test_every_handler_takes_a_payload_model() -> None:
    modules = [importlib.import_module(name) for name in _handler_modules()]
    typed = [q for m in modules for q in _typed_handlers(m)]
    assert len(typed) >= 5, typed  # the walk does find the platform's typed handlers
    assert [bad for m in modules for bad in _dict_payload_handlers(m)] == []


def test_the_handler_check_catches_a_dict_payload(tmp_path: Path, monkeypatch: Any) -> None:
    (tmp_path / "hf_bad_handler.py").write_text(
        "from typing import Any\n"
        "from libs.domain.envelope import EventEnvelope\n"
        "from libs.domain.task.events import TaskDeleted\n"
        "async def on_ok(env: EventEnvelope, ev: TaskDeleted) -> None: ...\n"
        "async def on_bad(env: EventEnvelope, payload: dict[str, Any]) -> None:\n"
        "    env.payload.get('task_id')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("hf_bad_handler")
    assert [q for q, _ in _event_handlers(module)] == ["on_ok", "on_bad"]
    assert _typed_handlers(module) == ["on_ok"]
    assert _dict_payload_handlers(module) == [
        "hf_bad_handler.on_bad: payload is dict[str, typing.Any]"
    ]
    assert [line for line, _ in _payload_dict_reads(tmp_path / "hf_bad_handler.py")] == [6]


# --- one list of services ----------------------------------------------------------------------

REGISTRY = ROOT / "heteroflow" / "services.py"
# The platform's code. (bench/ builds control planes of its own and names their connections.)
SCANNED = ("libs", "services", "agent", "heteroflow", "deploy")


def test_every_service_package_is_in_the_list() -> None:
    packages = sorted(p.parent.name for p in (ROOT / "services").glob("*/__init__.py"))
    listed = [spec.name for spec in SERVICES]
    assert len(set(listed)) == len(listed), listed
    for package in packages:
        spec = importlib.import_module(f"services.{package}").SERVICE
        assert spec in SERVICES, f"services/{package} is not in heteroflow/services.py"
        assert by_name(spec.name) is spec
    assert len(packages) == len(SERVICES)


def _service_names() -> set[str]:
    return {*names(), *(user.name for user in nats_users())}


def _literal_lists(path: Path, known: set[str]) -> Iterator[tuple[int, list[str]]]:
    """(line, names) of each tuple, list, set or dict in `path` whose literal strings (the
    keys, for a dict) name two or more services."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        items: list[ast.expr | None]
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            items = list(node.elts)
        elif isinstance(node, ast.Dict):
            items = list(node.keys)
        else:
            continue
        found = [
            i.value
            for i in items
            if isinstance(i, ast.Constant) and isinstance(i.value, str) and i.value in known
        ]
        if len(found) >= 2:
            yield node.lineno, found


def _other_lists(root: Path, known: set[str]) -> list[str]:
    return [
        f"{path.relative_to(root)}:{line}: {found}"
        for package in SCANNED
        for path in sorted((root / package).rglob("*.py"))
        if path != root / REGISTRY.relative_to(ROOT) and ".venv" not in path.parts
        for line, found in _literal_lists(path, known)
    ]


def test_nothing_else_lists_services() -> None:
    assert _other_lists(ROOT, _service_names()) == []


def test_the_check_catches_a_second_list(tmp_path: Path) -> None:
    """The rule above is only worth having if a new copied list turns it red."""
    (tmp_path / "heteroflow").mkdir()
    (tmp_path / "heteroflow" / "x.py").write_text(
        'ORDER = ("relay", "scheduler")\nUSERS = {"scheduler": 1, "api-gateway": 2}\n'
        'ONE = ("scheduler",)\n'
    )
    found = _other_lists(tmp_path, {"relay", "scheduler", "api-gateway"})
    assert [line.split(":")[1] for line in found] == ["1", "2"]
