"""The foundation suite: the event store's append paths and the gateway's create-task latency.

* CAS appends: one status change per transaction through `EventStore.execute` (load under
  `FOR UPDATE`, decide, append, project, commit), sequentially and from eight workers on
  distinct tasks. Compared with one-row-per-commit INSERTs on as many connections.
* Batched appends: `create_tasks` with 500 items per transaction, compared with one
  `executemany` in one transaction.
* Gateway: `heteroflow service api-gateway` in a child process, loaded by bench/gateway_load.py
  (a closed loop for capacity, then an open loop at a fixed rate without coordinated omission).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from functools import partial

from libs import auth
from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_transition
from libs.domain.task.model import TaskId, TaskSpec, TenantId
from libs.domain.task.states import Actor, TaskStatus
from libs.store.eventstore import EventStore

from . import Context
from .floors import CONCURRENCY, Throughput, sustained
from .gateway_load import GatewayLoad, gateway_load
from .report import Row, against

DESCRIPTION = "event store appends (CAS, batched) and gateway create-task latency"

CAS_N = 2_000
BATCHED_N = 10_000
BATCH_SIZE = 500
TENANT = TenantId("bench")
SPEC = TaskSpec(name="bench", image="busybox:latest", command="true")
MAX_CONNECTIONS = 32
# Time caps so a loaded machine cannot stretch the suite to minutes.
STORE_MAX_SECONDS = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("foundation")
    group.add_argument(
        "--rate", type=float, default=200.0, help="gateway requests per second (default 200)"
    )
    group.add_argument(
        "--duration", type=float, default=10.0, help="gateway measured seconds (default 10)"
    )
    group.add_argument(
        "--connections",
        type=int,
        default=MAX_CONNECTIONS,
        help=f"gateway client connections at most (default {MAX_CONNECTIONS})",
    )
    group.add_argument(
        "--gateway-workers",
        type=int,
        default=1,
        help="gateway processes (HETEROFLOW_GATEWAY_WORKERS; default 1)",
    )


async def run(ctx: Context) -> list[Row]:
    floors = ctx.floors
    with ctx.database() as url:
        store = await EventStore.open(url, max_size=CONCURRENCY + 2)
        try:
            await auth.create_tenant(store, TENANT, "bench")
            _, api_key = await auth.issue_api_key(store, TENANT, "bench")
            batched, ids = await batched_appends(store, BATCHED_N, BATCH_SIZE)
            # The batched run leaves pending tasks; each CAS run moves its own share once.
            if len(ids) < 2 * CAS_N:
                ids += await _create(store, 2 * CAS_N - len(ids))
            sequential = await cas_appends(store, ids[:CAS_N], concurrency=1)
            concurrent = await cas_appends(store, ids[CAS_N : 2 * CAS_N], concurrency=CONCURRENCY)
        finally:
            await store.close()
        gateway = await gateway_load(
            GatewayLoad(
                database_url=url,
                nats_url=ctx.servers.nats_url,
                api_key=api_key,
                rate=ctx.args.rate,
                duration=ctx.args.duration,
                connections=ctx.args.connections,
                workers=ctx.args.gateway_workers,
                # Capacity, not admission: shedding (bench/shedding.py) would refuse most of
                # a closed loop of this many connections from one tenant.
                env={
                    "HETEROFLOW_MAX_INFLIGHT_WRITES": "0",
                    "HETEROFLOW_TENANT_WRITE_RATE_PER_S": "0",
                },
            )
        )
    return [
        against(
            "store.cas_append.sequential",
            sequential.rate,
            "events/s",
            floors.pg_row_per_commit,
            sequential.note(),
        ),
        against(
            f"store.cas_append.concurrent_{CONCURRENCY}",
            concurrent.rate,
            "events/s",
            floors.pg_row_per_commit_concurrent,
            concurrent.note(f"{CONCURRENCY} workers on distinct tasks"),
        ),
        against(
            f"store.batched_append.batch_{BATCH_SIZE}",
            batched.rate,
            "events/s",
            floors.pg_batched,
            batched.note(),
        ),
        *gateway,
    ]


# --- event store -------------------------------------------------------------------------


async def _create(store: EventStore, n: int) -> list[TaskId]:
    ids: list[TaskId] = []
    for start in range(0, n, BATCH_SIZE):
        items = [(TENANT, SPEC, None, None)] * min(BATCH_SIZE, n - start)
        ids.extend(t.id for t in await store.create_tasks(items))
    return ids


async def batched_appends(store: EventStore, n: int, batch: int) -> tuple[Throughput, list[TaskId]]:
    """`create_tasks` in transactions of `batch` items (one event each); the new task ids."""
    ids: list[TaskId] = []
    start = time.perf_counter()
    deadline = start + STORE_MAX_SECONDS
    while len(ids) < n and time.perf_counter() < deadline:
        items = [(TENANT, SPEC, None, None)] * min(batch, n - len(ids))
        ids.extend(t.id for t in await store.create_tasks(items))
    return Throughput(len(ids), time.perf_counter() - start, n), ids


async def cas_appends(store: EventStore, ids: Sequence[TaskId], *, concurrency: int) -> Throughput:
    """`pending -> scheduled` on each task, CAS on the expected status, `concurrency` workers."""
    decide = partial(
        decide_transition,
        to=TaskStatus.SCHEDULED,
        actor=Actor.SCHEDULER,
        expected_status=TaskStatus.PENDING,
        reason_code=ReasonCode.PLACED,
        node_id="node-bench",
    )

    async def move(i: int) -> None:
        # Workers take distinct indexes, so each task moves once and no CAS misses.
        await store.execute(ids[i], decide)

    return await sustained([move] * concurrency, len(ids), STORE_MAX_SECONDS)
