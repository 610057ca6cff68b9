"""Poison messages reach the dead-letter queue, end to end on `heteroflow up` with its embedded
NATS and PostgreSQL (every service on its own NATS user, the local agent on its node's): a
task event that no consumer can read fails `max_deliver` times in every consumer of its
subject, and each consumer's copy lands in HF_DLQ once, made by the forwarder its process
runs; `heteroflow events dead-letters --consumers` shows them."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from nats.js.errors import NotFoundError

from heteroflow.asyncapi import all_routes
from libs.bus import subjects as s
from libs.bus.nats import HDR_DLQ_CONSUMER, connect
from libs.embedded import EmbeddedNats

from . import web
from .cluster import BIN

pytestmark = [pytest.mark.integration, pytest.mark.slow]

READY_WITHIN_S = 90.0
# Every consumer of the subject tries 8 times, a second apart (the default nak delay).
DEAD_WITHIN_S = 90.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Up:
    home: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes]

    def output(self) -> str:
        path = self.home.parent / "up.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    @property
    def nats_url(self) -> str:
        """The embedded server's admin URL, as the ops commands find it."""
        root = self.home / "nats"
        return EmbeddedNats(root, port=int((root / "port").read_text())).url

    def wait(self, cond: Callable[[], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < deadline, f"timed out waiting for {what}\n{self.output()}"
            time.sleep(0.2)


@pytest.fixture
def up() -> Iterator[Up]:
    """`heteroflow up` with its own embedded NATS and PostgreSQL under a fresh home."""
    root = Path(tempfile.mkdtemp(prefix="hf-dlq-"))
    home = root / "home"
    (home / "nats").mkdir(parents=True)
    # The embedded NATS port as `up` saves it, where the ops commands look it up.
    (home / "nats" / "port").write_text(str(_free_port()))
    port = _free_port()
    env = os.environ | {"HETEROFLOW_HOME": str(home), "HETEROFLOW_PORT": str(port)}
    env.pop("HETEROFLOW_NATS_PORT", None)
    env.pop("HETEROFLOW_NATS_URL", None)
    env.pop("HETEROFLOW_DATABASE_URL", None)
    out = (root / "up.log").open("ab")
    proc = subprocess.Popen([str(BIN), "up"], env=env, stdout=out, stderr=subprocess.STDOUT)
    platform = Up(home, env, proc)

    def ready() -> bool:
        try:
            return web.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        platform.wait(ready, "the platform ready", READY_WITHIN_S)
        yield platform
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        out.close()
        shutil.rmtree(root, ignore_errors=True)


def matches(filter_subject: str, subject: str) -> bool:
    """NATS subject matching: `*` one token, `>` the rest."""
    want, have = filter_subject.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


async def _consumers_of(url: str, subject: str) -> dict[str, int]:
    """The event consumers whose filter takes `subject`, each with its max_deliver."""
    nc = await connect(url, "test-dlq-consumers")
    try:
        infos = await nc.jetstream().consumers_info(s.EVENTS_STREAM)
    finally:
        await nc.close()
    return {
        i.name: i.config.max_deliver or 0
        for i in infos
        if i.config.filter_subject and matches(i.config.filter_subject, subject)
    }


async def _publish(url: str, subject: str, body: bytes) -> None:
    nc = await connect(url, "test-dlq-publish")
    try:
        await nc.jetstream().publish(subject, body, headers={s.HDR_MSG_ID: str(uuid.uuid4())})
    finally:
        await nc.close()


async def _dead(url: str, dlq: str) -> list[dict[str, Any]]:
    """The HF_DLQ messages on `dlq`: consumer and body of each."""
    nc = await connect(url, "test-dlq-read")
    js = nc.jetstream()
    out: list[dict[str, Any]] = []
    try:
        try:
            info = await js.stream_info(s.DLQ_STREAM, subjects_filter=dlq)
        except NotFoundError:
            return []
        if not (info.state.subjects or {}).get(dlq):
            return []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            try:
                msg = await js.get_msg(s.DLQ_STREAM, seq)
            except NotFoundError:
                continue
            if msg.subject == dlq:
                out.append(
                    {"consumer": (msg.headers or {}).get(HDR_DLQ_CONSUMER), "data": msg.data}
                )
    finally:
        await nc.close()
    return out


def test_a_task_event_no_consumer_can_read_lands_in_the_dlq_once_per_consumer(up: Up) -> None:
    task_id = f"poison-{uuid.uuid4().hex[:8]}"
    subject = s.event_subject("task", task_id, "task_status_changed")
    body = b'{"not": "an event envelope"}'  # every consumer's decode fails, on every delivery
    url = up.nats_url
    # What the code declares: every durable on the subject, with its max_deliver.
    consumers = {
        d.durable: d.max_deliver
        for r in all_routes()
        for d in r.durables
        if d.stream == s.EVENTS_STREAM and matches(d.subject, subject)
    }
    assert consumers, "no consumer on the task's status events"
    up.wait(  # /readyz may answer before every service has declared its consumers
        lambda: asyncio.run(_consumers_of(url, subject)) == consumers,
        f"the consumers {sorted(consumers)} declared",
        READY_WITHIN_S,
    )

    asyncio.run(_publish(url, subject, body))
    dlq = s.dlq_subject(subject)
    up.wait(
        lambda: {d["consumer"] for d in asyncio.run(_dead(url, dlq))} == set(consumers),
        f"a dead letter on {dlq} from each of {sorted(consumers)}",
        DEAD_WITHIN_S,
    )
    dead = asyncio.run(_dead(url, dlq))
    assert sorted(d["consumer"] for d in dead) == sorted(consumers)  # one copy per consumer
    assert all(d["data"] == body for d in dead)

    done = subprocess.run(
        [str(BIN), "events", "dead-letters", "--consumers"],
        env=up.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    listed = [json.loads(line) for line in done.stdout.splitlines()]
    ours = [d for d in listed if d["subject"] == subject]
    assert sorted(d["consumer"] for d in ours) == sorted(consumers), done.stdout
    assert all(
        d["data"] == body.decode()
        and d["stream"] == s.EVENTS_STREAM
        and d["dlq_subject"] == dlq
        and d["deliveries"] == consumers[d["consumer"]]
        for d in ours
    ), done.stdout
