"""The PostgreSQL event store: append-only events, CAS on (stream, version), projections in
the same transaction.

Commands load the aggregate from its projection row under `FOR UPDATE`, run a pure `decide`
function, append the events at the next versions and upsert the projection, then commit. A
concurrent writer either waits for the row lock and then sees the new state (its decide
raises Conflict), or, if it skipped the lock, hits the unique (stream_id, version) constraint;
both surface as `Conflict` and leave nothing written.

Two guards run first in the same transaction when the caller passes them: a leader's `fence`
(a stale token raises `Fenced`, see fencing.py) and an event consumer's `receipt` (an event
already handled makes the call a no-op, see inbox.py).

A batch of task commands on documents this store committed itself (written.py) skips the
separate lock: it is decided on those documents and written in one statement that locks the
rows and writes only if each is still at its document's version (`_known_steps`); a row that
moved makes that statement write nothing, and the batch takes the locked path.

Every write method, one command or a batch, takes the same path: its events become rows in
one `EventRows` (id, stream, version, payload JSON, metadata with the fence, one time),
inserted in one statement (records.py): with the projection rows of the tasks they leave
(`_append_tasks`, the task commands and creates), or before the projection is upserted
(`_append`, the other aggregates). A row read back is a `StoredEvent`, which is the
`EventEnvelope` the relay publishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast, overload

import psycopg
import structlog
from prometheus_client import Counter
from psycopg import AsyncConnection
from psycopg.rows import kwargs_row
from psycopg.types.json import Jsonb

from libs.domain.catalog import parse_payload
from libs.domain.errors import Conflict, DomainError, Fenced, NotFound, StoreUnavailable
from libs.domain.payload import Payload
from libs.domain.task.events import TaskCreated
from libs.domain.task.evolve import evolve_task
from libs.domain.task.model import Task, TaskId, TaskSpec, TenantId
from libs.domain.task.states import TaskStatus
from libs.ordering import mark_ordered

from . import fencing, inbox, projections
from .fencing import Fence
from .inbox import Receipt
from .migrations import migrate
from .pool import StorePool, autocommit
from .pool import rows as pool_rows
from .projections import TASKS, Aggregate, M
from .records import columns_of, from_records, records
from .types import EventRange, StoredEvent
from .written import Written

log = structlog.get_logger(__name__)

APPENDED = Counter("heteroflow_events_appended_total", "Events appended to the store", ["type"])
KNOWN_WRITES = Counter(
    "heteroflow_store_known_batches_total",
    "Batched task commands decided on documents the store held: written in one statement, or "
    "left to the locked path (a row had moved, or a step was refused or changed nothing)",
    ["outcome"],
)

Clock = Callable[[], datetime]
Decide = Callable[[Task], Sequence[Payload]]
# Tenant, spec, group, rank; and, when the caller records the new task's id in the same
# transaction (a job's node), that id.
NewTask = (
    tuple[TenantId, TaskSpec, str | None, int | None]
    | tuple[TenantId, TaskSpec, str | None, int | None, TaskId]
)
Step = tuple[str, Decide, dict[str, Any] | None]  # task id, its command, the events' metadata

INSERT_EVENT = """
INSERT INTO events (event_id, stream_id, stream_type, version, type, schema_version,
                    payload, metadata, occurred_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
RETURNING position
"""


INSERT_EVENT_NO_RETURN = INSERT_EVENT.replace("RETURNING position", "")
# A write's events in one statement, whatever their number (records.py).
INSERT_EVENTS = from_records(INSERT_EVENT)
INSERT_EVENTS_NO_RETURN = from_records(INSERT_EVENT_NO_RETURN)
EVENT_COLUMNS = columns_of(INSERT_EVENT)
# A write's task events and the projection rows of the tasks they leave, in one statement:
# the events' insert is a data-modifying CTE of the upsert (`EventStore._append_tasks`).
APPEND_TASKS = (
    f"WITH appended AS (\n{INSERT_EVENTS_NO_RETURN.strip()}\n)\n{TASKS.batch_sql.strip()}"
)


def _only_if_ok(insert_sql: str) -> str:
    """A batch insert (records.py) that inserts its rows only when the statement's `ok` holds."""
    rows_from = "%s::jsonb)"
    assert insert_sql.count(rows_from) == 1, insert_sql
    return insert_sql.replace(rows_from, rows_from + " WHERE (SELECT ok FROM ok)")


def _known_append(fenced: bool, include_deleted: bool) -> str:
    """APPEND_TASKS for documents the store already holds (`EventStore._known_steps`): the rows
    are locked in id order, as `_lock_tasks` locks them, and written only if every one is
    still at its document's version (and visible, and the fence current); otherwise nothing.
    Parameters: [lease, token,] ids, versions, [token,] count, events, task rows. Returns
    `ok` [and the fence's newest token]."""
    fence_cte = f"fence AS (\n{fencing.RAISE_FENCE.strip()}\n),\n" if fenced else ""
    where = ["(SELECT token FROM fence) <= %s"] if fenced else []
    if not include_deleted:
        where.append("tasks.deleted_at IS NULL")
    where_sql = f"\n    WHERE {' AND '.join(where)}" if where else ""
    result = "(SELECT ok FROM ok), (SELECT token FROM fence)" if fenced else "(SELECT ok FROM ok)"
    return (
        f"WITH {fence_cte}locked AS (\n"
        "    SELECT tasks.id FROM tasks\n"
        "    JOIN unnest(%s::text[], %s::integer[]) AS known (id, version)\n"
        f"        ON tasks.id = known.id AND tasks.version = known.version{where_sql}\n"
        "    ORDER BY tasks.id FOR UPDATE OF tasks\n"
        "),\nok AS (SELECT count(*) = %s AS ok FROM locked),\n"
        f"appended AS (\n{_only_if_ok(INSERT_EVENTS_NO_RETURN.strip())}\n),\n"
        f"projected AS (\n{_only_if_ok(TASKS.batch_sql.strip())}\n)\n"
        f"SELECT {result}"
    )


# APPEND_TASKS, written only if a caller's condition (`Guard`) holds when the statement runs;
# returns whether it did. The condition's parameters come first.
GUARDED_APPEND_TASKS = (
    "WITH ok AS (SELECT ({guard}) AS ok),\n"
    f"appended AS (\n{_only_if_ok(INSERT_EVENTS_NO_RETURN.strip())}\n),\n"
    f"projected AS (\n{_only_if_ok(TASKS.batch_sql.strip())}\n)\n"
    "SELECT ok FROM ok"
)


@dataclass(frozen=True)
class Guard:
    """A condition a create is written under, in SQL with its parameters: what the caller
    decided from (a queue it holds, say) is still so when the rows go in."""

    sql: str
    params: tuple[Any, ...] = ()


class GuardFailed(Exception):
    """The create's `Guard` did not hold: nothing was written."""


KNOWN_APPEND = {
    (fenced, deleted): _known_append(fenced, deleted)
    for fenced in (False, True)
    for deleted in (False, True)
}


@contextlib.contextmanager
def _conflict_of(params: Sequence[tuple[Any, ...]]) -> Iterator[None]:
    """A (stream, version) already taken, as the Conflict the caller's command gets."""
    try:
        yield
    except psycopg.errors.UniqueViolation:
        streams = sorted({p[1] for p in params})
        which = streams[0] if len(streams) == 1 else f"of {len(streams)} in the batch"
        raise Conflict(f"stream {which} moved concurrently; nothing was changed") from None


def _count(params: Sequence[tuple[Any, ...]]) -> None:
    """Count appended events by type. Counted at insert: a transaction that rolls back
    afterwards over-counts (see docs/operations.md, metrics)."""
    by_type: dict[str, int] = {}
    for p in params:
        by_type[p[4]] = by_type.get(p[4], 0) + 1
    for event_type, n in by_type.items():
        APPENDED.labels(event_type).inc(n)


def utcnow() -> datetime:
    return datetime.now(UTC)


def _migrate(url: str) -> list[int]:
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            return migrate(conn)
    except psycopg.OperationalError as exc:  # the store's edge: no driver error leaves it
        raise StoreUnavailable(f"store unavailable: {exc}") from exc


def new_task_id() -> TaskId:
    return TaskId("task-" + uuid.uuid4().hex[:20])


class EventRows:
    """The `events` rows of one write, in insert order (`EventStore._append` or
    `_append_tasks` inserts them all at once): the one place an event becomes a row. All
    rows of a write share its time."""

    __slots__ = ("at", "params")

    def __init__(self, at: datetime) -> None:
        self.at = at
        self.params: list[tuple[Any, ...]] = []

    def __bool__(self) -> bool:
        return bool(self.params)

    def add(self, stream_id: str, version: int, event: Payload, meta: Jsonb) -> None:
        """One row (INSERT_EVENT's parameters): a new event id, the stream and version, the
        payload as JSON, the metadata (with the writer's fence: `EventStore._meta`)."""
        self.params.append(
            (
                uuid.uuid4(),
                stream_id,
                event.stream_type,
                version,
                event.type,
                event.schema_version,
                projections.as_jsonb(event),
                meta,
                self.at,
            )
        )

    @overload
    def fold(
        self, agg: Aggregate[M], agg_id: str, current: M, events: Iterable[Payload], meta: Jsonb
    ) -> M: ...

    @overload
    def fold(
        self,
        agg: Aggregate[M],
        agg_id: str,
        current: M | None,
        events: Iterable[Payload],
        meta: Jsonb,
    ) -> M | None: ...

    def fold(
        self,
        agg: Aggregate[M],
        agg_id: str,
        current: M | None,
        events: Iterable[Payload],
        meta: Jsonb,
    ) -> M | None:
        """Add `events` at the versions after `current`'s (None: a new stream); return the
        aggregate they leave (`current` itself when there are none)."""
        state: Any = current
        for ev in events:
            version = (state.version if state is not None else 0) + 1
            self.add(agg_id, version, ev, meta)
            state = agg.evolve(state, ev, self.at, version)
        return cast("M | None", state)

    def stored(self, positions: Sequence[int]) -> list[StoredEvent]:
        """The rows as the store now holds them, at `positions` (what `_append` returned)."""
        return [
            StoredEvent.model_construct(
                position=position,
                event_id=p[0],
                stream_id=p[1],
                stream_type=p[2],
                version=p[3],
                type=p[4],
                schema_version=p[5],
                payload=p[6].obj.model_dump(mode="json"),
                metadata=p[7].obj,
                occurred_at=p[8],
            )
            for p, position in zip(self.params, positions, strict=True)
        ]


def _new_tasks(
    rows: EventRows, items: Sequence[NewTask], meta: Jsonb, generation: int
) -> list[Task]:
    """`task_created` rows (version 1 of new streams) for `items`; the tasks they create."""
    tasks: list[Task] = []
    for tenant_id, spec, group_id, rank, *chosen in items:
        ev = TaskCreated(
            task_id=chosen[0] if chosen else new_task_id(),
            tenant_id=tenant_id,
            spec=spec,
            group_id=group_id,
            rank=rank,
            generation=generation,
        )
        rows.add(ev.task_id, 1, ev, meta)
        tasks.append(evolve_task(None, ev, rows.at, 1))
    return tasks


class EventStore:
    """Async facade over the events table and its projections."""

    def __init__(self, pool: StorePool, clock: Clock = utcnow) -> None:
        self.pool = pool
        self.clock = clock
        # Task documents this store committed: a batch locking one of them at the same
        # version uses it instead of reading and parsing the row again (written.py).
        self.written = Written()

    @classmethod
    async def open(cls, url: str, *, min_size: int = 1, max_size: int = 10) -> EventStore:
        """Run migrations, then open a connection pool.

        Migrations use a synchronous connection and wait on an advisory lock, so they run in
        a thread: in `heteroflow up` every service shares the API's event loop."""
        applied = await asyncio.to_thread(_migrate, url)
        if applied:
            log.info("schema_migrated", versions=applied)
        pool = StorePool(url, min_size=min_size, max_size=max_size, open=False)
        await pool.open(wait=True)
        return cls(pool)

    async def close(self) -> None:
        await self.pool.close()

    # --- guards --------------------------------------------------------------------------

    @staticmethod
    async def _guard(
        conn: AsyncConnection[Any], fence: Fence | None, receipt: Receipt | None
    ) -> bool:
        """Check the writer's fence (its own, else its controller term's: `TERM_FENCE`) and
        record its receipt; False: already handled, skip."""
        fence = fencing.effective(fence)
        if fence is not None:
            await fencing.check(conn, fence)
        return receipt is None or await inbox.record(conn, receipt)

    async def claim_fence(self, fence: Fence) -> None:
        """Show the store a new leader's fence before its first write: from now on a write
        under an older token is refused, even if this leader has nothing to write yet.
        Raises `Fenced` when a newer token is already known."""
        async with self.pool.connection() as conn, conn.transaction():
            await fencing.check(conn, fence)

    @staticmethod
    def _meta(metadata: dict[str, Any] | None, fence: Fence | None) -> dict[str, Any]:
        meta = dict(metadata or {})
        fence = fencing.effective(fence)
        if fence is not None:
            meta |= fence.metadata()
        return meta

    # --- appending -----------------------------------------------------------------------
    #
    # Every write method builds its rows in one `EventRows` and inserts them with one
    # `_append_tasks` (task events with their projection rows, one statement) or one
    # `_append` (the projection upserted after it, in the same transaction).

    async def _append(
        self, conn: AsyncConnection[Any], rows: EventRows, *, positions: bool = False
    ) -> list[int]:
        """Insert `rows`: the one way an event enters the store, one statement whatever
        their number (records.py); with `positions`, their positions in insert order. A
        (stream, version) already taken raises Conflict (the caller's transaction then
        writes nothing)."""
        params = rows.params
        if not params:
            return []
        sql = INSERT_EVENTS if positions else INSERT_EVENTS_NO_RETURN
        found: list[int] = []
        with _conflict_of(params):
            async with conn.cursor() as cur:
                await cur.execute(sql, (records(EVENT_COLUMNS, params),))
                if positions:
                    # The rows were numbered in the array's order: ascending is insert order.
                    found = sorted(row[0] for row in await cur.fetchall())
        _count(params)
        return found

    async def _append_tasks(
        self, conn: AsyncConnection[Any], rows: EventRows, tasks: Iterable[Task]
    ) -> None:
        """Insert task events `rows` and upsert the projection rows of `tasks` (the tasks
        those events leave) in one statement (APPEND_TASKS). A (stream, version) already
        taken raises Conflict, and nothing of the statement is written."""
        params = (
            records(EVENT_COLUMNS, rows.params),
            records(TASKS.columns, projections.rows_by_id(TASKS, tasks)),
        )
        with _conflict_of(rows.params):
            await conn.execute(APPEND_TASKS, params)
        _count(rows.params)

    async def create_tasks(
        self,
        items: Sequence[NewTask],
        *,
        metadata: dict[str, Any] | None = None,
        generation: int = 0,
        guard: Guard | None = None,
    ) -> list[Task]:
        """Create tasks atomically (batched append). Items: tenant, spec, group, rank (and the
        new task's id, when the caller chose it).

        `generation`: the group generation of every item (a rollout batch is one generation).
        `guard`: written only if it holds in the statement itself, else `GuardFailed` and
        nothing written (the gateway's queue it holds, services/api_gateway/queueing.py).

        One statement in autocommit, its own transaction (`_append_tasks`): an API create
        is one round trip, with no BEGIN or COMMIT of its own."""
        rows = EventRows(self.clock())
        tasks = _new_tasks(rows, items, Jsonb(metadata or {}), generation)
        if not tasks:
            return tasks
        async with self.pool.connection() as conn, autocommit(conn):
            if guard is None:
                await self._append_tasks(conn, rows, tasks)
                return tasks  # not kept: new tasks are pending (see `_keep`)
            params = (
                *guard.params,
                records(EVENT_COLUMNS, rows.params),
                records(TASKS.columns, projections.rows_by_id(TASKS, tasks)),
            )
            with _conflict_of(rows.params):
                cur = await conn.execute(GUARDED_APPEND_TASKS.replace("{guard}", guard.sql), params)
                row = await cur.fetchone()
        if row is None or not row[0]:
            raise GuardFailed(guard.sql)
        _count(rows.params)
        return tasks

    async def create_task(
        self,
        tenant_id: TenantId,
        spec: TaskSpec,
        *,
        group_id: str | None = None,
        rank: int | None = None,
        metadata: dict[str, Any] | None = None,
        guard: Guard | None = None,
    ) -> Task:
        (task,) = await self.create_tasks(
            [(tenant_id, spec, group_id, rank)], metadata=metadata, guard=guard
        )
        return task

    async def execute(
        self,
        task_id: str,
        decide: Decide,
        *,
        tenant_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        include_deleted: bool = False,
        fence: Fence | None = None,
        receipt: Receipt | None = None,
    ) -> Task:
        """Load the task under a row lock, decide, append, project, commit.

        Returns the task after the events (unchanged when decide returned nothing, or when
        `receipt` shows the event was handled before).
        """
        async with self.pool.connection() as conn, conn.transaction():
            first = await self._guard(conn, fence, receipt)
            task = await self._load_for_update(conn, task_id, tenant_id, include_deleted)
            if not first:
                return task
            rows = EventRows(self.clock())
            meta = Jsonb(self._meta(metadata, fence))
            task = rows.fold(TASKS, task_id, task, decide(task), meta)
            if rows:
                await self._append_tasks(conn, rows, [task])
            return task

    async def execute_batch(
        self,
        decisions: dict[str, Decide],
        *,
        metadata: dict[str, Any] | None = None,
        fence: Fence | None = None,
        receipt: Receipt | None = None,
        known: dict[str, Task] | None = None,
    ) -> tuple[dict[str, Task], dict[str, DomainError]]:
        """Many task commands in one transaction (the scheduler's batched commit).

        Rows are locked in id order (no deadlock between batches); a command whose decide
        raises is left out and reported, the others commit together. `known` are documents
        the caller read before: one whose version is still the row's is used as it is
        instead of being read and parsed again (the lock and the CAS are the same). When
        every task's document is held, the batch is first decided on those and written in
        one statement (`_known_steps`); a decide may then run twice, so it must be pure.
        """
        done: dict[str, Task] = {}
        refused: dict[str, DomainError] = {}
        steps = [(task_id, decide, metadata) for task_id, decide in decisions.items()]
        async with self.pool.connection() as conn:
            if receipt is None:
                written = await self._known_steps(
                    conn, steps, fence, known or {}, include_deleted=False
                )
                if written is not None:
                    done = {t.id: t for t in written}
                    self._keep(done.values())
                    return done, refused
            async with _batch_writes(conn):
                if not await self._guard(conn, fence, receipt):
                    return done, refused
                outcomes = await self._steps(conn, steps, fence, known or {}, include_deleted=False)
            for (task_id, _, _), outcome in zip(steps, outcomes, strict=True):
                if isinstance(outcome, DomainError):
                    refused[task_id] = outcome
                else:
                    done[task_id] = outcome
        self._keep(done.values())
        return done, refused

    async def execute_steps(
        self, steps: Sequence[Step], *, fence: Fence | None = None
    ) -> list[Task | DomainError]:
        """Many task commands in one transaction, in order, each with its own metadata (a
        batch of agent reports). Several steps may name one task: each decides on the task
        as the steps before it left it. A step whose decide raises (a CAS miss) is refused
        alone, with its error in its place in the result; the rest commit together. Deleted
        tasks are included (an agent still reports on them). As in `execute_batch`, a
        decide may run twice (held documents first, `_known_steps`)."""
        async with self.pool.connection() as conn:
            written = await self._known_steps(conn, steps, fence, {}, include_deleted=True)
            if written is not None:
                self._keep(written)
                return list(written)
            async with _batch_writes(conn):
                await self._guard(conn, fence, None)
                out = await self._steps(conn, steps, fence, {}, include_deleted=True)
        self._keep(t for t in out if isinstance(t, Task))
        return out

    def _keep(self, tasks: Iterable[Task]) -> None:
        """Keep committed documents for the next batch's lock (written.py), except pending
        ones: the placer reads those each round and hands them over itself (`known`), so
        keeping them would only push out the placed tasks the agents' reports come for."""
        self.written.add(t for t in tasks if t.status is not TaskStatus.PENDING)

    async def _known_steps(
        self,
        conn: AsyncConnection[Any],
        steps: Sequence[Step],
        fence: Fence | None,
        known: dict[str, Task],
        *,
        include_deleted: bool,
    ) -> list[Task] | None:
        """The batch in one statement, when this store holds the document of every task it
        names (its own commits, written.py, or `known`): each step decided on those documents,
        the rows written only if every task is still at its document's version, checked and
        locked by the statement itself (`KNOWN_APPEND`). A document's content at a version
        never changes, so the decisions are the ones the locked path would make. One round
        trip in autocommit, where the locked path makes three or four in pipeline mode.

        None, with nothing written: a task not held (or deleted, where deleted ones are not
        included), a step refused or deciding nothing (the locked path decides those on the
        row and answers them one by one), or a row that had moved; the caller then takes the
        locked path. A stale fence raises `Fenced` here as there."""
        if not steps:
            return None
        ids = {s[0] for s in steps}
        current = self.written.known(ids, known)
        if len(current) != len(ids) or (
            not include_deleted and any(t.deleted_at is not None for t in current.values())
        ):
            KNOWN_WRITES.labels("not_held").inc()
            return None
        versions = {task_id: t.version for task_id, t in current.items()}
        rows, changed, out, unchanged = self._decide(steps, current, fence)
        if unchanged:
            KNOWN_WRITES.labels("left_to_lock").inc()
            return None
        fence = fencing.effective(fence)
        ordered = sorted(versions)
        head: tuple[Any, ...] = (fence.lease, fence.token) if fence else ()
        middle: tuple[Any, ...] = (fence.token,) if fence else ()
        params = (
            *head,
            ordered,
            [versions[i] for i in ordered],
            *middle,
            len(ordered),
            records(EVENT_COLUMNS, rows.params),
            records(TASKS.columns, projections.rows_by_id(TASKS, changed.values())),
        )
        with _conflict_of(rows.params):
            async with autocommit(conn):
                cur = await conn.execute(KNOWN_APPEND[(fence is not None, include_deleted)], params)
                row = await cur.fetchone()
        assert row is not None
        if fence is not None and int(row[1]) > fence.token:
            raise Fenced(fence.lease, fence.token, int(row[1]))
        if not row[0]:
            KNOWN_WRITES.labels("moved").inc()
            return None
        KNOWN_WRITES.labels("written").inc()
        _count(rows.params)
        return [t for t in out if isinstance(t, Task)]

    async def _steps(
        self,
        conn: AsyncConnection[Any],
        steps: Sequence[Step],
        fence: Fence | None,
        known: dict[str, Task],
        *,
        include_deleted: bool,
    ) -> list[Task | DomainError]:
        """The steps of `execute_batch` and `execute_steps`: every step's rows in one
        `EventRows`, written with the changed tasks' projection rows in one statement
        (`_append_tasks`)."""
        ids = {s[0] for s in steps}
        current = await _lock_tasks(conn, ids, self.written.known(ids, known), include_deleted)
        mark_ordered()  # a pipelined consumer's next batch may start deciding now
        rows, changed, out, _ = self._decide(steps, current, fence)
        if rows:
            await self._append_tasks(conn, rows, changed.values())
        return out

    def _decide(
        self, steps: Sequence[Step], current: dict[str, Task], fence: Fence | None
    ) -> tuple[EventRows, dict[str, Task], list[Task | DomainError], int]:
        """Each step decided on `current` as the steps before it left it (updated in place):
        the rows, the tasks changed, each step's outcome (the task after it, or why it was
        refused: NotFound for a task not in `current`), and how many steps changed nothing
        or were refused."""
        rows = EventRows(self.clock())
        changed: dict[str, Task] = {}
        out: list[Task | DomainError] = []
        unchanged = 0
        for task_id, decide, metadata in steps:
            task = current.get(task_id)
            if task is None:
                out.append(NotFound("task"))
                unchanged += 1
                continue
            try:
                events = list(decide(task))
            except DomainError as exc:
                out.append(exc)
                unchanged += 1
                continue
            if events:
                meta = Jsonb(self._meta(metadata, fence))
                task = rows.fold(TASKS, task_id, task, events, meta)
                current[task_id] = changed[task_id] = task
            else:
                unchanged += 1
            out.append(task)
        return rows, changed, out, unchanged

    async def execute_with_tasks(
        self,
        agg: Aggregate[M],
        agg_id: str,
        decide: Callable[[M | None], tuple[Sequence[Payload], Sequence[NewTask]]],
        *,
        metadata: dict[str, Any] | None = None,
        fence: Fence | None = None,
        receipt: Receipt | None = None,
        generation: int = 0,
    ) -> tuple[M | None, list[Task]]:
        """Append to an aggregate and create tasks in one transaction (group membership);
        `generation`: the group generation the new tasks belong to."""
        meta = Jsonb(self._meta(metadata, fence))
        async with self.pool.connection() as conn, conn.transaction():
            first = await self._guard(conn, fence, receipt)
            current = await self._lock(conn, agg, agg_id)
            if not first:
                return current, []
            events, new_tasks = decide(current)
            rows = EventRows(self.clock())
            result: M | None = rows.fold(agg, agg_id, current, events, meta)
            tasks = _new_tasks(rows, new_tasks, meta, generation)
            await self._append(conn, rows)
            if events and result is not None:
                await projections.upsert(conn, agg, [result])
            await projections.upsert_tasks(conn, tasks)
            return result, tasks

    async def execute_aggregate(
        self,
        agg: Aggregate[M],
        agg_id: str,
        decide: Callable[[M | None], Sequence[Payload]],
        *,
        metadata: dict[str, Any] | None = None,
        fence: Fence | None = None,
        receipt: Receipt | None = None,
    ) -> M | None:
        """Like `execute` for any aggregate; `decide` gets None when the stream is new."""
        meta = Jsonb(self._meta(metadata, fence))
        async with self.pool.connection() as conn, conn.transaction():
            first = await self._guard(conn, fence, receipt)
            current = await self._lock(conn, agg, agg_id)
            if not first:
                return current
            rows = EventRows(self.clock())
            new: M | None = rows.fold(agg, agg_id, current, decide(current), meta)
            if rows and new is not None:
                await self._append(conn, rows)
                await projections.upsert(conn, agg, [new])
            return new

    async def _lock(self, conn: AsyncConnection[Any], agg: Aggregate[M], agg_id: str) -> M | None:
        """The aggregate's current state under a lock that also serialises writers of a stream
        that has no row yet (a transaction-scoped advisory lock on its id)."""
        await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (agg_id,))
        cur = await conn.execute(f"SELECT doc FROM {agg.table} WHERE id = %s FOR UPDATE", (agg_id,))
        row = await cur.fetchone()
        return agg.model.model_validate(row[0]) if row else None

    async def _load_for_update(
        self, conn: AsyncConnection[Any], task_id: str, tenant_id: str | None, deleted: bool
    ) -> Task:
        return await _visible_task(conn, task_id, tenant_id, deleted, for_update=True)

    async def append_stream(
        self,
        stream_id: str,
        events: Sequence[Payload],
        *,
        expected_version: int | None = None,
        metadata: dict[str, Any] | None = None,
        fence: Fence | None = None,
        receipt: Receipt | None = None,
    ) -> list[StoredEvent]:
        """Append to a non-task stream (tenant, system) and project it.

        `expected_version=None` appends at the end whatever it is; otherwise CAS on it.
        A transaction-scoped advisory lock on the stream id serialises writers of the stream.
        """
        async with self.pool.connection() as conn, conn.transaction():
            if not await self._guard(conn, fence, receipt):
                return []
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (stream_id,)
            )
            cur = await conn.execute(
                "SELECT coalesce(max(version), 0) FROM events WHERE stream_id = %s", (stream_id,)
            )
            row = await cur.fetchone()
            current = int(row[0]) if row else 0
            if expected_version is not None and current != expected_version:
                raise Conflict(
                    f"stream {stream_id} is at version {current}, expected {expected_version}"
                )
            rows = EventRows(self.clock())
            meta = Jsonb(self._meta(metadata, fence))
            for offset, ev in enumerate(events, start=1):
                rows.add(stream_id, current + offset, ev, meta)
            stored = rows.stored(await self._append(conn, rows, positions=True))
            for ev, st in zip(events, stored, strict=True):
                await projections.apply_other(conn, st, ev)
            return stored

    # --- reading -------------------------------------------------------------------------

    async def get_task(
        self, task_id: str, *, tenant_id: str | None = None, include_deleted: bool = False
    ) -> Task:
        async with self.pool.connection() as conn:
            return await _visible_task(conn, task_id, tenant_id, include_deleted)

    async def tasks_by_ids(self, ids: Sequence[str]) -> dict[str, Task]:
        """The named tasks as their rows are now (deleted ones included), by id. A task this
        store committed at the row's version is taken as kept (written.py): only versions are
        read for it, not its document."""
        kept = self.written.known(ids)
        found: dict[str, Task] = {}
        stale = list(ids)
        if kept:
            versions = await pool_rows(
                self, "SELECT id, version FROM tasks WHERE id = ANY(%s)", [list(ids)]
            )
            stale = []
            for row in versions:
                task = kept.get(row["id"])
                if task is not None and task.version == row["version"]:
                    found[task.id] = task
                else:
                    stale.append(row["id"])
        if stale:
            docs = await pool_rows(
                self, "SELECT doc::text AS doc FROM tasks WHERE id = ANY(%s)", [stale]
            )
            for row in docs:
                task = Task.model_validate_json(row["doc"])
                found[task.id] = task
        return found

    async def read_stream(self, stream_id: str) -> list[StoredEvent]:
        return await self._read("WHERE stream_id = %s ORDER BY version", (stream_id,))

    async def read_all(self, after_position: int = 0, limit: int = 1000) -> list[StoredEvent]:
        return await self._read(
            "WHERE position > %s ORDER BY position LIMIT %s", (after_position, limit)
        )

    async def _read(self, where: str, params: tuple[Any, ...]) -> list[StoredEvent]:
        sql = (
            "SELECT position, event_id, stream_id, stream_type, version, type, schema_version,"
            f" payload, occurred_at, metadata FROM events {where}"
        )
        # model_construct: the rows come from our own table (the relay reads them the same way).
        async with (
            self.pool.connection() as conn,
            conn.cursor(row_factory=kwargs_row(StoredEvent.model_construct)) as cur,
        ):
            await cur.execute(sql, params)
            return await cur.fetchall()

    async def read_range(
        self, where: EventRange, after_position: int = 0, limit: int = 1000
    ) -> list[StoredEvent]:
        """Events in `where` past `after_position`, in commit order (export, republish)."""
        clause, params = where.clause()
        return await self._read(
            f"WHERE {clause} AND position > %s ORDER BY position LIMIT %s",
            (*params, after_position, limit),
        )

    async def last_of_type(self, stream_id: str, event_type: str) -> StoredEvent | None:
        """The newest event of one type in a stream (the retry engine's last decision)."""
        found = await self._read(
            "WHERE stream_id = %s AND type = %s ORDER BY version DESC LIMIT 1",
            (stream_id, event_type),
        )
        return found[0] if found else None


async def _visible_task(
    conn: AsyncConnection[Any],
    task_id: str,
    tenant_id: str | None,
    include_deleted: bool,
    *,
    for_update: bool = False,
) -> Task:
    """The task as its caller may see it: another tenant's or a deleted task is NotFound."""
    lock = " FOR UPDATE" if for_update else ""
    cur = await conn.execute(
        f"SELECT tenant_id, deleted_at, doc FROM tasks WHERE id = %s{lock}", (task_id,)
    )
    row = await cur.fetchone()
    if row is None or (tenant_id is not None and row[0] != tenant_id):
        raise NotFound("task")
    if row[1] is not None and not include_deleted:
        raise NotFound("task")
    return Task.model_validate(row[2])


async def _lock_tasks(
    conn: AsyncConnection[Any], ids: set[str], known: dict[str, Task], include_deleted: bool
) -> dict[str, Task]:
    """Lock the rows of `ids` (in id order: no deadlock between batches) and return their
    tasks; a `known` task whose version is the row's is taken as it is, the others are read."""
    visible = "" if include_deleted else " AND deleted_at IS NULL"
    cur = await conn.execute(
        f"SELECT id, version FROM tasks WHERE id = ANY(%s){visible} ORDER BY id FOR UPDATE",
        (sorted(ids),),
    )
    found: dict[str, Task] = {}
    stale: list[str] = []
    for task_id, version in await cur.fetchall():
        task = known.get(task_id)
        if task is not None and task.version == version:
            found[task_id] = task
        else:
            stale.append(task_id)
    if stale:
        cur = await conn.execute("SELECT doc::text FROM tasks WHERE id = ANY(%s)", (stale,))
        for (doc,) in await cur.fetchall():
            task = Task.model_validate_json(doc)
            found[task.id] = task
    return found


@contextlib.asynccontextmanager
async def _batch_writes(conn: AsyncConnection[Any]) -> AsyncIterator[None]:
    """A transaction in pipeline mode, for the batched commands: the reads that decide (the
    fence, the row locks) still wait for their answers, but the event inserts, the projection
    upserts and the COMMIT go to the server together, one round trip instead of three. An
    insert's unique violation then surfaces at the commit rather than at the insert; it is
    the same `Conflict` `_append` raises, and the transaction has written nothing."""
    try:
        async with conn.pipeline(), conn.transaction():
            yield
    except psycopg.errors.UniqueViolation:
        raise Conflict("a stream of the batch moved concurrently; nothing was changed") from None


def payload_of(stored: StoredEvent) -> Payload:
    return parse_payload(stored.type, stored.payload)
