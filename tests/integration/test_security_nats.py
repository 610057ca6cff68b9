"""NATS identities on a real nats-server configured as `up` configures it: an agent's user
publishes only its own node's subjects and consumes only its own commands; only the scheduler
publishes commands, only the relay events; nobody but the admin administers streams. Each
refusal is the server's own permissions violation."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import nats
import pytest
from nats.aio.client import Client

from heteroflow.services import nats_users
from libs.bus import permissions as perms
from libs.bus import subjects as s
from libs.bus.nats import ensure_durable_consumer, ensure_streams
from libs.embedded import EmbeddedNats

pytestmark = pytest.mark.integration

KEYS = {"n1": "hf_ag_key-of-node-one", "n2": "hf_ag_key-of-node-two"}
DENIED = "permissions violation"


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[EmbeddedNats]:
    """The server as `up` runs it: two registered nodes, streams declared by the admin."""
    root = Path(tempfile.mkdtemp(prefix="hf-nats-perms-"))
    srv = EmbeddedNats(root / "nats", services=nats_users())
    srv.nodes = {n: bcrypt.hashpw(k.encode(), bcrypt.gensalt(4)).decode() for n, k in KEYS.items()}
    srv.start()
    admin = await nats.connect(srv.url)
    await ensure_streams(admin.jetstream())
    await admin.close()
    yield srv
    srv.stop()
    shutil.rmtree(root, ignore_errors=True)


@dataclass
class Conn:
    nc: Client
    errors: list[str] = field(default_factory=list)

    async def denied(self, what: str, within_s: float = 5.0) -> None:
        """Wait for the server's permissions violation naming `what`."""
        deadline = asyncio.get_running_loop().time() + within_s
        while asyncio.get_running_loop().time() < deadline:
            if any(DENIED in e.lower() and what.lower() in e.lower() for e in self.errors):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"no permissions violation for {what!r}: {self.errors}")


@contextlib.asynccontextmanager
async def login(server: EmbeddedNats, user: str, password: str, **kw: str) -> AsyncIterator[Conn]:
    conn = Conn(nc=None)  # type: ignore[arg-type]

    async def on_error(exc: Exception) -> None:
        conn.errors.append(str(exc))

    conn.nc = await nats.connect(
        server.plain_url, user=user, password=password, error_cb=on_error, **kw
    )
    try:
        yield conn
    finally:
        await conn.nc.close()


def agent(server: EmbeddedNats, node: str) -> contextlib.AbstractAsyncContextManager[Conn]:
    return login(
        server, perms.nats_user(node), KEYS[node], inbox_prefix=perms.agent_inbox_prefix(node)
    )


def service(server: EmbeddedNats, user: str) -> contextlib.AbstractAsyncContextManager[Conn]:
    return login(server, user, server.users()[user])


async def stream_count(server: EmbeddedNats, stream: str, subject: str) -> int:
    nc = await nats.connect(server.url)
    try:
        info = await nc.jetstream().stream_info(stream, subjects_filter=subject)
        return sum((info.state.subjects or {}).values())
    finally:
        await nc.close()


async def test_an_agent_uses_only_its_own_subjects_and_consumer(server: EmbeddedNats) -> None:
    cmd_n1, cmd_n2 = s.node_command_subject("n1"), s.node_command_subject("n2")
    async with agent(server, "n1") as a:
        js = a.nc.jetstream()
        # What it needs works: its consumer, its report, its heartbeat.
        await ensure_durable_consumer(js, s.NODE_STREAM, perms.agent_durable("n1"), cmd_n1)
        ack = await js.publish(s.node_report_subject("n1"), b"{}")
        assert ack.stream == s.NODE_STREAM
        await a.nc.publish(s.node_heartbeat_subject("n1"), b"{}")
        await a.nc.flush()
        assert a.errors == []
        # What it must not do, each refused by the server.
        forged = [cmd_n2, s.node_report_subject("n2"), s.event_subject("task", "t1", "x")]
        for subject in forged:
            await a.nc.publish(subject, b"{}")
            await a.denied(f'"{subject}"')
        for durable, subject in (("agent-n1", cmd_n2), ("agent-n2", cmd_n2), ("x", cmd_n1)):
            with pytest.raises(asyncio.TimeoutError):
                await js.add_consumer(
                    s.NODE_STREAM, name=durable, durable_name=durable, filter_subject=subject,
                    timeout=1,
                )  # fmt: skip
            await a.denied(f"CONSUMER.CREATE.{s.NODE_STREAM}.{durable}")
        for op, stream in (
            ("DELETE", s.EVENTS_STREAM),
            ("CREATE", "MINE"),
            ("INFO", s.EVENTS_STREAM),
        ):
            with pytest.raises(nats.errors.TimeoutError):
                await a.nc.request(f"$JS.API.STREAM.{op}.{stream}", b"{}", timeout=1)
            await a.denied(f"$JS.API.STREAM.{op}.{stream}")
        # Nor may it listen to another node's traffic or to other clients' inboxes.
        for subject in (cmd_n2, s.node_logs_subject("n2"), "_INBOX.>"):
            await a.nc.subscribe(subject)
            await a.denied(f'"{subject}"')
    assert await stream_count(server, s.NODE_STREAM, cmd_n2) == 0
    assert await stream_count(server, s.NODE_STREAM, s.node_report_subject("n2")) == 0
    assert await stream_count(server, s.EVENTS_STREAM, f"{s.EVENTS_PREFIX}.>") == 0


async def test_an_agent_key_logs_in_only_as_its_node(server: EmbeddedNats) -> None:
    with pytest.raises(Exception, match="(?i)authorization"):
        await nats.connect(
            server.plain_url,
            user=perms.nats_user("n2"),
            password=KEYS["n1"],
            allow_reconnect=False,
            max_reconnect_attempts=0,
        )


@pytest.mark.parametrize(
    ("user", "subject", "allowed"),
    [
        ("scheduler", s.node_command_subject("n2"), True),
        ("api-gateway", s.node_command_subject("n2"), False),
        ("retry-engine", s.node_command_subject("n2"), False),
        ("outbox-relay", s.event_subject("task", "t2", "task_created"), True),
        ("scheduler", s.event_subject("task", "t2", "task_created"), False),
        ("event-timeline", s.event_subject("task", "t2", "task_created"), False),
        ("scheduler", s.node_report_subject("n2"), False),
        ("api-gateway", s.node_logs_subject("n2"), True),
        ("api-gateway", s.serving_metrics_subject("grp-1"), True),
        ("autoscaler", s.serving_metrics_subject("grp-1"), False),
    ],
)
async def test_services_publish_only_what_is_theirs(
    server: EmbeddedNats, user: str, subject: str, allowed: bool
) -> None:
    async with service(server, user) as c:
        await c.nc.publish(subject, b"{}")
        await c.nc.flush()
        if allowed:
            await asyncio.sleep(0)  # an error would have arrived before the flush's PONG
            assert c.errors == []
        else:
            await c.denied(f'"{subject}"')


@pytest.mark.parametrize("user", [u.name for u in nats_users()])
async def test_only_the_admin_administers_streams(server: EmbeddedNats, user: str) -> None:
    async with service(server, user) as c:
        js = c.nc.jetstream()
        # Reading and declaring what already exists is allowed (no write is sent).
        await ensure_streams(js)
        for op in ("PURGE", "DELETE", "UPDATE"):
            with pytest.raises(nats.errors.TimeoutError):
                await c.nc.request(f"$JS.API.STREAM.{op}.{s.EVENTS_STREAM}", b"{}", timeout=1)
            await c.denied(f"$JS.API.STREAM.{op}.{s.EVENTS_STREAM}")
        assert c.errors == [e for e in c.errors if DENIED in e.lower()]


async def test_a_new_key_for_a_node_shuts_out_the_old_one(server: EmbeddedNats) -> None:
    def hashed(key: str) -> str:
        return bcrypt.hashpw(key.encode(), bcrypt.gensalt(4)).decode()

    assert server.set_nodes(server.nodes | {"n3": hashed("old-key")})
    closed = asyncio.Event()

    async def on_closed() -> None:
        closed.set()

    old = await nats.connect(
        server.plain_url,
        user="agent-n3",
        password="old-key",
        max_reconnect_attempts=1,
        closed_cb=on_closed,
    )
    try:
        assert server.set_nodes(server.nodes | {"n3": hashed("new-key")})  # reloads the server
        await asyncio.wait_for(closed.wait(), 10)  # the old key's connection is dropped
    finally:
        await old.close()
    with pytest.raises(Exception, match="(?i)authorization"):
        await nats.connect(
            server.plain_url, user="agent-n3", password="old-key", allow_reconnect=False
        )
    new = await nats.connect(server.plain_url, user="agent-n3", password="new-key")
    await new.close()
