"""Poison messages reach the dead-letter queue, end to end on `heteroflow up` (real processes,
real NATS and PostgreSQL): a task event that no consumer can read fails `max_deliver` times
in every consumer of its subject, and each consumer's forwarder-made copy lands in HF_DLQ
once, where `heteroflow events dead-letters --consumers` shows it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from typing import Any

import pytest
from nats.js.errors import NotFoundError

from libs.bus import subjects as s
from libs.bus.nats import HDR_DLQ_CONSUMER, connect

from .cluster import BIN, Cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Every consumer of the subject tries 8 times, a second apart (the default nak delay).
DEAD_WITHIN_S = 90.0


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


def test_a_task_event_no_consumer_can_read_lands_in_the_dlq_once_per_consumer(
    cluster: Cluster,
) -> None:
    task_id = f"poison-{uuid.uuid4().hex[:8]}"
    subject = s.event_subject("task", task_id, "task_status_changed")
    body = b'{"not": "an event envelope"}'  # every consumer's decode fails, on every delivery
    url = cluster.nats.url
    consumers = asyncio.run(_consumers_of(url, subject))
    assert consumers, "no consumer on the task's status events"

    asyncio.run(_publish(url, subject, body))
    dlq = s.dlq_subject(subject)
    cluster.wait(
        lambda: {d["consumer"] for d in asyncio.run(_dead(url, dlq))} == set(consumers),
        f"a dead letter on {dlq} from each of {sorted(consumers)}",
        timeout=DEAD_WITHIN_S,
    )
    dead = asyncio.run(_dead(url, dlq))
    assert sorted(d["consumer"] for d in dead) == sorted(consumers)  # one copy per consumer
    assert all(d["data"] == body for d in dead)

    done = subprocess.run(
        [str(BIN), "events", "dead-letters", "--consumers"],
        env=cluster.env,
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
