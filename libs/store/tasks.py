"""Reads of the `tasks` projection: the task list and stats, the scheduler's pending queue
and GPU holders, group members and the tasks a lost node or card touches.

The rows are written only by the append path (`eventstore` + `projections`), in the
transaction of the events they fold; this module is where every read of them lives.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from libs.domain.errors import DomainError, NotFound
from libs.domain.payload import Payload
from libs.domain.task.model import Task
from libs.domain.task.states import GPU_HOLDING, TaskStatus

from .eventstore import EventStore, Step
from .pool import contains, page_of, rows
from .types import TaskQuery

SORT_COLUMNS = {"created_at": "created_at", "updated_at": "updated_at", "priority": "priority"}
HOLDING = [s.value for s in GPU_HOLDING]


def _tasks(found: list[dict[str, Any]]) -> list[Task]:
    return [Task.model_validate(r["doc"]) for r in found]


def _parsed(found: list[dict[str, Any]]) -> list[Task]:
    """Documents read as text (`doc::text AS doc`): pydantic parses JSON text into a model
    about twice as fast as `json.loads` and then validating the dict (the hot reads)."""
    return [Task.model_validate_json(r["doc"]) for r in found]


async def list_tasks(store: EventStore, q: TaskQuery) -> tuple[list[Task], int]:
    """A page of GET /tasks and the total that matches."""
    where = ["deleted_at IS NULL"]
    params: list[Any] = []
    if q.tenant_id is not None:
        where.append("tenant_id = %s")
        params.append(q.tenant_id)
    if q.status:
        where.append("status = %s")
        params.append(q.status)
    if q.node_id:
        where.append("node_id = %s")
        params.append(q.node_id)
    if q.name:
        where.append("name ILIKE %s")
        params.append(contains(q.name))
    if q.labels:
        where.append("labels @> %s")
        params.append(Jsonb(q.labels))
    if q.group_id:
        where.append("group_id = %s")
        params.append(q.group_id)
    direction = "ASC" if q.order == "asc" else "DESC"
    order = f"{SORT_COLUMNS[q.sort]} {direction}, id {direction}"
    found, total = await page_of(store, "tasks", where, params, order, q.page, q.per_page)
    return _tasks(found), total


async def task_stats(store: EventStore, tenant_id: str | None) -> dict[str, int]:
    """Counts by status (every status listed, zeros included), scoped like the task list."""
    where = "deleted_at IS NULL" + (" AND tenant_id = %s" if tenant_id is not None else "")
    params = [tenant_id] if tenant_id is not None else []
    found = await rows(
        store, f"SELECT status, count(*) AS n FROM tasks WHERE {where} GROUP BY status", params
    )
    counts = {s.value: 0 for s in TaskStatus}
    for r in found:
        counts[r["status"]] = int(r["n"])
    return counts


async def by_ids(store: EventStore, ids: Sequence[str]) -> list[Task]:
    """The named tasks (deleted ones included), in no particular order."""
    found = await rows(store, "SELECT doc::text AS doc FROM tasks WHERE id = ANY(%s)", [list(ids)])
    return _parsed(found)


async def each_by_ids(store: EventStore, ids: Sequence[str]) -> Iterator[Task]:
    """The named tasks, parsed one at a time as the caller iterates (see `nodes.each_by_ids`)."""
    found = await rows(store, "SELECT doc FROM tasks WHERE id = ANY(%s)", [list(ids)])
    return (Task.model_validate(r["doc"]) for r in found)


async def pending(store: EventStore, limit: int) -> list[Task]:
    """The scheduler's queue: highest priority first, then oldest (the partial index)."""
    listed = await pending_since(store, limit, {})  # nothing known: every document is sent
    return [Task.model_validate_json(doc) for _, doc in listed if doc is not None]


async def pending_since(
    store: EventStore, limit: int, known: Mapping[str, int]
) -> list[tuple[str, str | None]]:
    """The scheduler's queue as (id, document text), highest priority first, then
    oldest (the partial index): the text only for a row whose version is not the one `known`
    holds for it, so a caller that keeps what it parsed re-reads only what moved. A row that
    moved again after this read is simply sent next time (its version is then new again)."""
    found = await rows(
        store,
        "SELECT p.id,"
        " CASE WHEN k.v IS DISTINCT FROM p.version THEN p.doc::text END AS doc"
        " FROM (SELECT id, version, doc, priority, created_at FROM tasks"
        "  WHERE status = 'pending' AND deleted_at IS NULL"
        "  ORDER BY priority DESC, created_at LIMIT %s) p"
        " LEFT JOIN unnest(%s::text[], %s::int[]) AS k(id, v) ON k.id = p.id"
        " ORDER BY p.priority DESC, p.created_at",
        [limit, list(known), list(known.values())],
    )
    return [(r["id"], r["doc"]) for r in found]


async def holding(store: EventStore) -> list[Task]:
    """Every task that holds (or is about to hold) GPUs on a node."""
    sql = "SELECT doc::text AS doc FROM tasks WHERE status = ANY(%s)"
    return _parsed(await rows(store, sql, [HOLDING]))


async def holding_versions(store: EventStore) -> dict[str, int]:
    """id → version of every GPU-holding task (the scheduler view re-reads only movers)."""
    found = await rows(store, "SELECT id, version FROM tasks WHERE status = ANY(%s)", [HOLDING])
    return {r["id"]: r["version"] for r in found}


async def lenders(store: EventStore) -> list[Task]:
    """Sleeping tasks whose card is lent (libs/domain/task/lending.py): the scheduler checks each
    round whether the borrower still holds it."""
    sql = (
        "SELECT doc::text AS doc FROM tasks WHERE status = 'sleeping'"
        " AND coalesce(doc->>'lent_to', '') <> ''"
    )
    return _parsed(await rows(store, sql, []))


async def of_group(store: EventStore, group_id: str, *, include_deleted: bool = True) -> list[Task]:
    """Every task of a group, superseded members included."""
    sql = "SELECT doc FROM tasks WHERE group_id = %s"
    if not include_deleted:
        sql += " AND deleted_at IS NULL"
    return _tasks(await rows(store, sql, [group_id]))


async def serving_targets(store: EventStore) -> list[str]:
    """Serving targets that may go idle: the group (or the task itself when it has none) of
    every running task that declares `serving` and an idle timeout."""
    found = await rows(
        store,
        "SELECT DISTINCT COALESCE(group_id, id) AS target FROM tasks"
        " WHERE status = 'running' AND deleted_at IS NULL"
        " AND jsonb_typeof(doc->'spec'->'serving') = 'object'"
        " AND (doc->'spec'->>'idle_timeout_minutes')::int > 0",
        [],
    )
    return [r["target"] for r in found]


async def ids_of_group(store: EventStore, group_id: str) -> list[str]:
    """Ids of every task of a group, superseded and deleted members included."""
    found = await rows(store, "SELECT id FROM tasks WHERE group_id = %s", [group_id])
    return [r["id"] for r in found]


async def ids_on_node(
    store: EventStore, node_id: str, statuses: Collection[TaskStatus]
) -> list[str]:
    """Ids of the tasks placed on a node in one of `statuses` (a lost node's tasks)."""
    found = await rows(
        store,
        "SELECT id FROM tasks WHERE node_id = %s AND status = ANY(%s)",
        [node_id, [s.value for s in statuses]],
    )
    return [r["id"] for r in found]


async def on_nodes(
    store: EventStore, node_ids: Sequence[str], statuses: Collection[TaskStatus]
) -> dict[str, str]:
    """Task id → node id of the tasks placed on any of `node_ids` in one of `statuses`."""
    found = await rows(
        store,
        "SELECT id, node_id FROM tasks WHERE node_id = ANY(%s) AND status = ANY(%s)",
        [list(node_ids), [s.value for s in statuses]],
    )
    return {r["id"]: r["node_id"] for r in found}


async def ids_pinned_pending(store: EventStore, node_id: str) -> list[str]:
    """Ids of the live pending tasks that asked for this node by name."""
    found = await rows(
        store,
        "SELECT id FROM tasks WHERE doc->'spec'->>'requested_node_id' = %s"
        " AND status = 'pending' AND deleted_at IS NULL",
        [node_id],
    )
    return [r["id"] for r in found]


async def ids_holding_card(store: EventStore, node_id: str, gpu_id: str) -> list[str]:
    """Ids of the GPU-holding tasks on a node whose placement includes this card."""
    found = await rows(
        store,
        "SELECT id FROM tasks WHERE node_id = %s AND status = ANY(%s) AND doc->'gpu_ids' ? %s",
        [node_id, HOLDING, gpu_id],
    )
    return [r["id"] for r in found]


async def count_by_status(store: EventStore, status: TaskStatus) -> int:
    """Live tasks in one status (benchmarks and operators)."""
    found = await rows(
        store,
        "SELECT count(*) AS n FROM tasks WHERE status = %s AND deleted_at IS NULL",
        [status.value],
    )
    return int(found[0]["n"])


async def queue_usage(store: EventStore, queue: str) -> dict[str, float]:
    """What a queue's tasks hold (GPU-holding set of SPEC §1) and how many wait.

    Cards: whole cards as requested, a fraction as its compute ratio (the scheduler counts
    the larger of compute and VRAM share of its card; this read does not know the card)."""
    found = await rows(
        store,
        "SELECT count(*) FILTER (WHERE status = ANY(%s)) AS running_tasks,"
        " coalesce(sum(CASE WHEN (doc->'spec'->>'gpu_required')::int > 0"
        "   THEN (doc->'spec'->>'gpu_required')::float"
        "   ELSE (doc->'spec'->>'gpu_compute_ratio')::float END)"
        "   FILTER (WHERE status = ANY(%s)), 0) AS gpus,"
        " count(DISTINCT coalesce(nullif(doc->'spec'->'platform'->>'job_id', ''), id))"
        "   FILTER (WHERE status = ANY(%s)) AS running_jobs,"
        " count(*) FILTER (WHERE status = 'pending' AND deleted_at IS NULL) AS pending"
        " FROM tasks WHERE doc->'spec'->>'queue' = %s",
        [HOLDING, HOLDING, HOLDING, queue],
    )
    row = found[0]
    return {k: float(row[k]) for k in ("gpus", "running_tasks", "running_jobs", "pending")}


async def tenant_gpus(store: EventStore, tenant_id: str) -> float:
    """GPUs a tenant holds or waits for (GPU-holding set of SPEC §1 plus pending): the
    AutoScaler caps new replicas by what is left of the quota after these. Whole cards as
    requested, a fraction as its compute ratio; a borrower's card is its lender's."""
    found = await rows(
        store,
        "SELECT coalesce(sum(CASE WHEN (doc->'spec'->>'gpu_required')::int > 0"
        "   THEN (doc->'spec'->>'gpu_required')::float"
        "   ELSE coalesce((doc->'spec'->>'gpu_compute_ratio')::float, 0) END), 0) AS gpus"
        " FROM tasks t WHERE tenant_id = %s AND deleted_at IS NULL"
        " AND (status = ANY(%s) OR status = 'pending')"
        # A borrower runs on its sleeping lender's card: that card is counted once.
        " AND NOT EXISTS (SELECT 1 FROM tasks l WHERE l.id = t.doc->>'borrowed_from'"
        "   AND l.status = ANY(%s))",
        [tenant_id, HOLDING, HOLDING],
    )
    return float(found[0]["gpus"])


async def of_job(store: EventStore, job_id: str) -> list[Task]:
    """Every task created for a job (`spec.platform.job_id`), deleted ones included."""
    found = await rows(
        store,
        "SELECT doc FROM tasks WHERE doc->'spec'->'platform'->>'job_id' = %s ORDER BY created_at",
        [job_id],
    )
    return _tasks(found)


async def job_of(store: EventStore, task_id: str) -> str | None:
    """The job a task was created for (`spec.platform.job_id`; "" for none), deleted tasks
    included; None when there is no such task. One field read, not the document."""
    found = await rows(
        store,
        "SELECT coalesce(doc->'spec'->'platform'->>'job_id', '') AS job_id"
        " FROM tasks WHERE id = %s",
        [task_id],
    )
    return str(found[0]["job_id"]) if found else None


async def placements(
    store: EventStore, statuses: Collection[TaskStatus]
) -> list[tuple[str, str, TaskStatus, int]]:
    """(id, node id or "", status, attempt) of every task in one of `statuses` (the sweep)."""
    found = await rows(
        store,
        "SELECT id, COALESCE(node_id, '') AS node_id, status,"
        " (doc->>'retry_count')::int + COALESCE((doc->>'requeues')::int, 0) AS attempt"
        " FROM tasks WHERE status = ANY(%s)",
        [[s.value for s in statuses]],
    )
    return [(r["id"], r["node_id"], TaskStatus(r["status"]), r["attempt"] or 0) for r in found]


async def nodes_of(store: EventStore, ids: Sequence[str]) -> dict[str, tuple[str, int]]:
    """Task id → (the node it is placed on, "" when none; its attempt) for the ids that exist."""
    found = await rows(
        store,
        "SELECT id, COALESCE(node_id, '') AS node_id,"
        " (doc->>'retry_count')::int + COALESCE((doc->>'requeues')::int, 0) AS attempt"
        " FROM tasks WHERE id = ANY(%s)",
        [list(ids)],
    )
    return {r["id"]: (r["node_id"], r["attempt"] or 0) for r in found}


# --- commands that depend on the host --------------------------------------------------

# A task command that needs to know whether the task's node is online (libs/domain/
# serving_control.py: a wake, the end of a stop on a lost host).
HostDecide = Callable[[Task, bool], Sequence[Payload]]

_LOCK_WITH_NODE = (
    "SELECT t.id, t.tenant_id, t.deleted_at IS NOT NULL AS deleted, n.status AS node_status"
    " FROM tasks t LEFT JOIN nodes n ON n.id = t.node_id"
    " WHERE t.id = ANY(%s) ORDER BY t.id FOR UPDATE OF t"
)


async def _lock_with_node(
    conn: AsyncConnection[Any], ids: Sequence[str], tenant_id: str | None
) -> dict[str, bool]:
    """Lock the visible rows of `ids` and read, in the same statement, whether each one's
    node is online: task id → online. While the row is locked its placement cannot move,
    so the answer holds until the caller's commit."""
    cur = await conn.execute(_LOCK_WITH_NODE, (sorted(ids),))
    online: dict[str, bool] = {}
    for task_id, tenant, deleted, node_status in await cur.fetchall():
        if deleted or (tenant_id is not None and tenant != tenant_id):
            continue
        online[task_id] = node_status == "online"
    return online


def _bind(decide: HostDecide, online: bool) -> Callable[[Task], Sequence[Payload]]:
    return lambda task: decide(task, online)


async def execute_by_host(
    store: EventStore,
    task_id: str,
    *decides: HostDecide,
    tenant_id: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> Task:
    """Run `decides` on one task in one transaction, each given whether the task's node is
    online as read under the task's row lock, each deciding on the task as the one before
    left it. Any refusal raises and nothing is written. Another tenant's or a deleted task
    is NotFound. Returns the task after the events."""
    async with store.pool.connection() as conn, conn.transaction():
        await store._guard(conn, None, None)  # a controller term's fence, when in one
        online = await _lock_with_node(conn, [task_id], tenant_id)
        if task_id not in online:
            raise NotFound("task")
        steps: list[Step] = [(task_id, _bind(d, online[task_id]), metadata) for d in decides]
        outcomes = await store._steps(conn, steps, None, {}, include_deleted=False)
        for outcome in outcomes:
            if isinstance(outcome, DomainError):
                raise outcome  # rolls the whole transaction back
        last = outcomes[-1]
        assert isinstance(last, Task)
        return last


async def execute_batch_by_host(
    store: EventStore, decisions: dict[str, HostDecide], *, metadata: dict[str, Any] | None = None
) -> tuple[dict[str, Task], dict[str, DomainError]]:
    """`execute_by_host` for many tasks in one transaction (a target's sleeping replicas):
    a command that is refused is left out and reported, the others commit together."""
    done: dict[str, Task] = {}
    refused: dict[str, DomainError] = {}
    async with store.pool.connection() as conn, conn.transaction():
        await store._guard(conn, None, None)
        online = await _lock_with_node(conn, list(decisions), None)
        steps: list[Step] = [
            (task_id, _bind(decide, online[task_id]), metadata)
            for task_id, decide in decisions.items()
            if task_id in online
        ]
        outcomes = await store._steps(conn, steps, None, {}, include_deleted=False)
        for (task_id, _, _), outcome in zip(steps, outcomes, strict=True):
            if isinstance(outcome, DomainError):
                refused[task_id] = outcome
            else:
                done[task_id] = outcome
    for task_id in decisions.keys() - online.keys():
        refused[task_id] = NotFound("task")
    return done, refused


# --- the "why pending" answer (services/api_gateway/planning.py) --------------------------

_PENDING = "status = 'pending' AND deleted_at IS NULL"


def _ahead(task: Task, fifo: bool, queues_first: Sequence[str]) -> tuple[str, list[Any]]:
    floor = 0 if fifo else task.spec.priority
    where = (
        f"{_PENDING} AND id <> %s AND (priority > %s OR (created_at, id) < (%s, %s)"
        " OR doc->'spec'->>'queue' = ANY(%s))"
    )
    return where, [task.id, floor, task.created_at, task.id, list(queues_first)]


async def pending_ahead(
    store: EventStore, task: Task, fifo: bool, queues_first: Sequence[str], limit: int
) -> list[Task] | None:
    """Pending tasks that may come before `task` in the planner's order, and none that
    cannot: a higher task priority (any, in a `fifo` queue), older, or in a queue of a higher
    priority (`queues_first`). The caller orders them exactly. None: more than `limit`
    (counted first, so a long queue costs a count, not its documents)."""
    where, params = _ahead(task, fifo, queues_first)
    counted = await rows(store, f"SELECT count(*) AS n FROM tasks WHERE {where}", params)
    if int(counted[0]["n"]) > limit:
        return None
    found = await rows(
        store,
        f"SELECT doc::text AS doc FROM tasks WHERE {where} ORDER BY priority DESC, created_at",
        params,
    )
    return _parsed(found)


async def queue_position(store: EventStore, task: Task, fifo: bool) -> int:
    """1 + the pending tasks of `task`'s queue before it in the planner's order (its queue's
    policy: submission order when `fifo`, else priority then submission)."""
    order = (
        "(created_at, id) < (%s, %s)"
        if fifo
        else "(priority > %s OR (priority = %s AND (created_at, id) < (%s, %s)))"
    )
    params: list[Any] = [task.created_at, task.id]
    if not fifo:
        params = [task.spec.priority, task.spec.priority, *params]
    found = await rows(
        store,
        f"SELECT count(*) AS n FROM tasks WHERE {_PENDING}"
        f" AND coalesce(doc->'spec'->>'queue', '') = %s AND {order}",
        [task.spec.queue, *params],
    )
    return 1 + int(found[0]["n"])


async def finished_runtimes(
    store: EventStore, tenants: Collection[str], per_tenant: int
) -> list[tuple[str, str, float]]:
    """(tenant, image, seconds from started_at to finished_at) of each tenant's newest
    `per_tenant` completed tasks: what a typical runtime is learned from."""
    if not tenants:
        return []
    found = await rows(
        store,
        "SELECT tenant_id, image, seconds FROM ("
        "  SELECT tenant_id, coalesce(doc->'spec'->>'image', '') AS image,"
        "   extract(epoch FROM (doc->>'finished_at')::timestamptz"
        "     - (doc->>'started_at')::timestamptz)::float AS seconds,"
        "   row_number() OVER (PARTITION BY tenant_id ORDER BY created_at DESC) AS n"
        "  FROM tasks WHERE tenant_id = ANY(%s) AND status = 'completed'"
        "   AND deleted_at IS NULL AND doc->>'started_at' IS NOT NULL"
        "   AND doc->>'finished_at' IS NOT NULL"
        ") newest WHERE n <= %s",
        [sorted(tenants), per_tenant],
    )
    return [(r["tenant_id"], r["image"], float(r["seconds"])) for r in found]
