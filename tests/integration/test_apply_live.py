"""`heteroflow apply -f examples/` against the real gateway over PostgreSQL, through the
Python client: every example is created, a second apply changes nothing, an edited image is
shown as a diff and then rolled out, `--dry-run` writes no event, and what `get` writes
back applies as unchanged."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from heteroflow.cli_user.apply import Clients, apply_files, delete_files, get_document, render
from heteroflow.client import AsyncClient
from heteroflow.files.load import Document, load, parse_text
from libs import auth
from services.api_gateway.app import create_app

from .helpers import Api

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
async def clients(api: Api) -> AsyncIterator[Clients]:
    await auth.create_tenant(api.store, "default", "default")  # the examples' queue tenant
    transport = httpx.ASGITransport(app=create_app(api.settings, api.store))

    def client(headers: dict[str, str]) -> AsyncClient:
        token = headers["Authorization"].removeprefix("Bearer ")
        return AsyncClient("http://gw", token, transport=transport)

    c = Clients(client(api.tenant), client(api.operator))
    try:
        yield c
    finally:
        await c.tenant.aclose()
        assert c.operator is not None
        await c.operator.aclose()


async def _events(api: Api) -> int:
    async with api.store.pool.connection() as conn:
        row = await (await conn.execute("SELECT count(*) FROM events")).fetchone()
    assert row is not None
    return int(row[0])


async def _apply(
    clients: Clients, docs: list[Document], *, dry_run: bool = False
) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = await apply_files(clients, docs, out, err, dry_run=dry_run)
    return rc, out.getvalue() + err.getvalue()


async def test_examples_apply_then_unchanged_then_a_rollout(
    api: Api, clients: Clients, tmp_path: Path
) -> None:
    docs = load([EXAMPLES])
    assert {d.kind for d in docs} == {"Task", "TaskGroup", "Job", "Queue", "Pool"}
    empty = await _events(api)
    rc, text = await _apply(clients, docs, dry_run=True)
    assert rc == 0, text
    assert text.count(" would be created") == len(docs), text
    # Each creation's plan (POST .../plan): every rank or task, and why it would wait.
    for planned in ("  task: pending at", "  rank 0: pending at", "  nightly-etl-prep: pending"):
        assert planned in text, text
    assert "the cluster has no nodes" in text, text
    assert await _events(api) == empty  # planned, not made

    rc, text = await _apply(clients, docs)
    assert rc == 0, text
    assert text.count(" created") == len(docs), text

    before = await _events(api)
    rc, text = await _apply(clients, load([EXAMPLES]))
    assert rc == 0, text
    assert sorted(text.splitlines()) == sorted(f"{d.ref} unchanged" for d in docs), text
    assert await _events(api) == before

    edited = tmp_path / "chat.yaml"
    source = (EXAMPLES / "inference-group.yaml").read_text()
    edited.write_text(source.replace("image: python:3.11-slim", "image: python:3.12-slim"))
    rc, text = await _apply(clients, load([edited]), dry_run=True)
    assert rc == 0, text
    assert 'image: "python:3.11-slim" -> "python:3.12-slim"  (rollout)' in text, text
    assert await _events(api) == before  # the dry run wrote nothing

    rc, text = await _apply(clients, load([edited]))
    assert rc == 0, text
    assert 'image: "python:3.11-slim" -> "python:3.12-slim"  (rollout)' in text, text
    assert "TaskGroup/chat rollout started (ro-" in text, text
    chat = await get_document(clients, "TaskGroup", "chat")
    assert chat is not None and chat["spec"]["image"] == "python:3.12-slim"
    groups = await clients.tenant.request("GET", "/task-groups", params={"name": "chat"})
    gid = groups["groups"][0]["id"]
    rollout = await clients.tenant.request("GET", f"/task-groups/{gid}/rollout")
    assert rollout["phase"] == "running" and rollout["request"]["image"] == "python:3.12-slim"

    rc, text = await _apply(clients, load([edited]))
    assert (rc, text.strip()) == (0, "TaskGroup/chat unchanged"), text

    # A pending task and a queue are updated in place (PUT), then unchanged.
    edits = tmp_path / "edits.yaml"
    edits.write_text(
        (EXAMPLES / "task.yaml").read_text().replace("memory_mb: 64", "memory_mb: 96")
        + "---\n"
        + (EXAMPLES / "queue-and-pool.yaml").read_text().replace("priority: 10", "priority: 20")
    )
    rc, text = await _apply(clients, load([edits]))
    assert rc == 0, text
    for line in ("Pool/cpu-nodes unchanged", "Queue/research updated", "Task/hello updated"):
        assert line in text, text
    assert "  priority: 10 -> 20  (update)" in text and "  memory_mb: 64 -> 96  (update)" in text
    rc, text = await _apply(clients, load([edits]))
    assert rc == 0 and text.count(" unchanged") == 3, text

    # What `get -o yaml` writes applies over the live objects as unchanged.
    written = []
    for doc in docs:
        document = await get_document(clients, doc.kind, doc.name)
        assert document is not None, doc.ref
        written += parse_text(render(document, "yaml"), f"get {doc.ref}")
    count = await _events(api)
    rc, text = await _apply(clients, written)
    assert rc == 0, text
    assert all(line.endswith(" unchanged") for line in text.splitlines()), text
    assert await _events(api) == count

    out, err = io.StringIO(), io.StringIO()
    assert await delete_files(clients, load([EXAMPLES]), out, err) == 0, err.getvalue()
    assert sorted(out.getvalue().splitlines()) == sorted(f"{d.ref} deleted" for d in docs)
    for doc in docs:
        assert await get_document(clients, doc.kind, doc.name) is None, doc.ref


async def test_a_refusal_of_the_server_names_the_line_of_the_field(
    clients: Clients, tmp_path: Path
) -> None:
    """The host-path allow-list is the server's: its 400 is mapped back onto the file."""
    path = tmp_path / "group.yaml"
    path.write_text(
        "apiVersion: heteroflow/v1\nkind: TaskGroup\nmetadata:\n  name: g\nspec:\n"
        "  image: busybox:latest\n  task_count: 1\n  volumes:\n"
        "    - host_path: /etc/secrets\n      container_path: /work\n"
    )
    rc, text = await _apply(clients, load([path]))
    assert rc == 1
    assert f"{path}, document 1 (TaskGroup 'g'), line 9: spec.volumes.0.host_path" in text, text
