"""A generated event store: every event kind the projections handle, in a realistic mix.

Tasks dominate, as in a real store: created, waiting with a pending reason, placed, started,
running, then completed, failed and requeued by the retry engine (with placement constraints,
a larger memory limit, a cleared placement), stopped, drained and cancelled, deleted; some are
group members or inference replicas; some pending ones have their configuration updated.
A few payloads are stored in an older shape (a version-1 reason without a code, a spec from
before a field existed), as a store written by earlier releases holds them. Nodes, groups,
jobs, pools, queues, tenants, keys and join tokens are interleaved.

Each stream's events get increasing times from a random start; the store's order is by time,
so streams interleave as concurrent work does. Deterministic for a given seed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from libs.domain.catalog import PAYLOAD_TYPES
from libs.domain.group.events import GroupCreated, GroupDeleted, GroupScaled, GroupStatusChanged
from libs.domain.group.model import GroupShape, GroupSpec, GroupStatus
from libs.domain.group.serving import ServingSpec
from libs.domain.job.events import JobNodeSettled, JobStatusChanged, JobSubmitted, JobTasksReady
from libs.domain.job.model import JobStatus, NodeState
from libs.domain.job.spec import JobNodeSpec, JobSpec
from libs.domain.node.events import (
    CardQuarantined,
    CardRestored,
    GpuLost,
    GpuRecovered,
    NodeOffline,
    NodeRegistered,
)
from libs.domain.node.model import GpuCard, NodeInventory
from libs.domain.payload import Payload
from libs.domain.pool.events import (
    PoolCreated,
    PoolDeleted,
    PoolUpdated,
    QueueCreated,
    QueueUpdated,
)
from libs.domain.pool.model import (
    NodeSelector,
    PoolSpec,
    QueueQuota,
    QueueSpec,
    pool_stream,
    queue_stream,
)
from libs.domain.reasons import ReasonCode
from libs.domain.task.events import (
    TaskConfigUpdated,
    TaskCreated,
    TaskDeleted,
    TaskDrainMarked,
    TaskPendingReason,
    TaskRetryDecided,
    TaskStatusChanged,
)
from libs.domain.task.model import TaskId, TaskSpec, TenantId, Volume
from libs.domain.task.states import TaskStatus as S
from libs.domain.tenant.events import (
    ApiKeyIssued,
    JoinTokenIssued,
    NodeJoined,
    SystemCredentialIssued,
    TenantCreated,
    TenantUpdated,
)

T0 = datetime(2026, 11, 1, tzinfo=UTC)
SPAN_S = 3_600.0
CODES = list(ReasonCode)


@dataclass(frozen=True)
class Event:
    """One stored event: where it belongs, its payload model and the JSON the store holds."""

    stream_id: str
    stream_type: str
    version: int
    type: str
    payload: Payload  # what the live path evolved (parsed, as a loader would, when legacy)
    stored: dict[str, Any]  # the payload column
    at: datetime


class _Streams:
    """Collects (time, stream, payload) and numbers each stream's versions in time order."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.items: list[tuple[float, int, str, Payload, dict[str, Any] | None]] = []

    def stream(
        self, stream_id: str, events: Sequence[Payload | tuple[Payload, dict[str, Any]]]
    ) -> None:
        t = self.rng.uniform(0, SPAN_S)
        for ev in events:
            payload, stored = ev if isinstance(ev, tuple) else (ev, None)
            self.items.append((t, len(self.items), stream_id, payload, stored))
            # Some events of a stream share a transaction (the same time), most do not.
            t += 0.0 if self.rng.random() < 0.1 else self.rng.expovariate(2.0)

    def events(self) -> list[Event]:
        versions: dict[str, int] = {}
        out: list[Event] = []
        for t, _, sid, payload, stored in sorted(self.items):
            versions[sid] = versions.get(sid, 0) + 1
            out.append(
                Event(
                    sid,
                    payload.stream_type,
                    versions[sid],
                    payload.type,
                    payload,
                    stored if stored is not None else payload.model_dump(mode="json"),
                    T0 + timedelta(seconds=round(t, 6)),
                )
            )
        return out


def _legacy(payload: Payload) -> tuple[Payload, dict[str, Any]]:
    """The payload as a version-1 producer stored it (text only), and what a load makes of it."""
    raw = payload.model_dump(mode="json")
    del raw["reason_code"]
    raw["schema_version"] = 1
    return PAYLOAD_TYPES[payload.type].model_validate(raw), raw


def _old_spec(created: TaskCreated) -> tuple[Payload, dict[str, Any]]:
    """A `task_created` whose spec predates queues (`queue` absent, its default applies)."""
    raw = created.model_dump(mode="json")
    del raw["spec"]["queue"]
    return PAYLOAD_TYPES[created.type].model_validate(raw), raw


class _Tasks:
    def __init__(self, rng: random.Random, nodes: list[str]) -> None:
        self.rng = rng
        self.nodes = nodes

    def spec(self, i: int) -> TaskSpec:
        r = self.rng
        kind = r.random()
        extra: dict[str, Any] = {}
        if kind < 0.15:
            extra = {
                "serving": ServingSpec(port=8000, health_path="/health"),
                "task_type": "inference",
            }
        elif kind < 0.25:
            extra = {"volumes": (Volume(host_path="/data", container_path="/in", read_only=True),)}
        return TaskSpec(
            name=f"job-{i}",
            image=r.choice(["busybox:latest", "vllm/vllm:0.6", ""]),
            command="echo hi" if r.random() < 0.5 else "",
            gpu_required=r.choice([0, 1, 1, 2, 4, 8]),
            memory_mb=r.choice([1024, 2048, 8192]),
            cpu_cores=r.choice([0.5, 1.0, 2.0, 4.0]),
            priority=r.randrange(0, 70),
            max_retries=r.choice([0, 1, 3]),
            env={"SEED": str(i)} if r.random() < 0.3 else {},
            labels={"team": r.choice(["a", "b", "c"]), "i": str(i)} if r.random() < 0.6 else {},
            anti_affinity=("gpu-x",) if r.random() < 0.05 else (),
            retry_delay=r.choice([None, 5.0]),
            **extra,
        )

    def reason(self, tid: TaskId) -> Payload | tuple[Payload, dict[str, Any]]:
        ev = TaskPendingReason(
            task_id=tid,
            reason_code=self.rng.choice(CODES),
            reason=self.rng.choice(["no node has 8 free cards", "queue quota reached"]),
        )
        return _legacy(ev) if self.rng.random() < 0.05 else ev

    def move(
        self, tid: TaskId, src: S, to: S, legacy: bool = False, **extra: Any
    ) -> Payload | tuple[Payload, dict[str, Any]]:
        ev = TaskStatusChanged(
            task_id=tid,
            from_status=src,
            to_status=to,
            actor=self.rng.choice(["scheduler", "agent", "tenant", "retry_engine"]),
            reason_code=self.rng.choice(CODES),
            reason=self.rng.choice(["", "placed on a node", "exited", "requeued"]),
            **extra,
        )
        return _legacy(ev) if legacy or self.rng.random() < 0.02 else ev

    def lifecycle(self, i: int, group: tuple[str, int] | None = None) -> list[Any]:
        r = self.rng
        tid = TaskId(f"task-{i:07d}")
        created = TaskCreated(
            task_id=tid,
            tenant_id=TenantId(r.choice(["acme", "beta"])),
            spec=self.spec(i),
            group_id=group[0] if group else None,
            rank=group[1] if group else None,
            generation=r.choice([0, 0, 1]) if group else 0,
        )
        out: list[Any] = [_old_spec(created) if r.random() < 0.02 else created]
        if r.random() < 0.3:
            out += [self.reason(tid) for _ in range(r.randint(1, 2))]
        if r.random() < 0.04:
            changes = r.choice([{"priority": 5}, {"idle_timeout_minutes": 10}, {"memory_mb": 4096}])
            out.append(TaskConfigUpdated(task_id=tid, changes=changes))
        if r.random() < 0.04:
            out.append(self.move(tid, S.PENDING, S.CANCELLED))
            return self._maybe_deleted(tid, out)
        for attempt in range(3):
            node = r.choice(self.nodes)
            out.append(
                self.move(
                    tid,
                    S.PENDING,
                    S.SCHEDULED,
                    node_id=node,
                    gpu_ids=tuple(f"{node}-gpu{k}" for k in range(r.randint(0, 2))),
                    qos=r.choice(["guaranteed", "burstable"]),
                    gpu_label="nvidia/A100-80GB",
                    ports=r.choice([None, {"master": 20000 + attempt}, {"serve": 21000}]),
                )
            )
            out.append(self.move(tid, S.SCHEDULED, S.STARTING, engine=r.choice([None, "vllm"])))
            serve = f"10.0.0.{r.randint(1, 250)}:8000" if r.random() < 0.15 else None
            out.append(
                self.move(
                    tid, S.STARTING, S.RUNNING, container_id=f"c-{i}-{attempt}", serve_address=serve
                )
            )
            fate = r.random()
            if fate < 0.65:
                out.append(self.move(tid, S.RUNNING, S.COMPLETED, exit_code=0, result="ok"))
                break
            if fate < 0.85 and attempt < 2:
                out += self._requeue(tid, node, attempt)
                continue
            if fate < 0.92:
                out.append(self.move(tid, S.RUNNING, S.STOPPING))
                out.append(self.move(tid, S.STOPPING, S.STOPPED, exit_code=143))
            elif fate < 0.96:
                out.append(TaskDrainMarked(task_id=tid, reason_code=ReasonCode.UNSPECIFIED))
                out.append(self.move(tid, S.RUNNING, S.CANCELLED))
            else:
                out.append(
                    self.move(tid, S.RUNNING, S.FAILED, exit_code=1, error="boom", error_kind="app")
                )
            break
        return self._maybe_deleted(tid, out)

    def _requeue(self, tid: TaskId, node: str, attempt: int) -> list[Any]:
        r = self.rng
        oom = r.random() < 0.4
        return [
            self.move(
                tid,
                S.RUNNING,
                S.FAILED,
                exit_code=137 if oom else 2,
                error="OOMKilled" if oom else "exit 2",
                error_kind="oom" if oom else "app",
                oom_killed=oom,
            ),
            TaskRetryDecided(
                task_id=tid,
                attempt=attempt,
                node_id=node,
                failure_class="transient",
                failure_kind="oom" if oom else "app",
                action="retry",
                reason="retrying",
                delay_s=5.0,
                memory_mb=4096 if oom else None,
            ),
            self.move(
                tid,
                S.FAILED,
                S.PENDING,
                clear_placement=True,
                retry_count=attempt + 1,
                memory_mb=4096 if oom else None,
                error=None if r.random() < 0.5 else "exit 2",
                not_before=T0 + timedelta(seconds=r.randint(1, 9999), microseconds=r.randint(0, 9)),
                same_node_id=node if r.random() < 0.3 else None,
                avoid_node_ids=(node,) if r.random() < 0.5 else None,
                min_vram_mb=40_000 if r.random() < 0.2 else None,
            ),
        ]

    def _maybe_deleted(self, tid: TaskId, out: list[Any]) -> list[Any]:
        if self.rng.random() < 0.05:
            out.append(TaskDeleted(task_id=tid))
        return out


def _nodes(streams: _Streams, n: int) -> list[str]:
    r = streams.rng
    ids = [f"node-{k:04d}" for k in range(n)]
    for node in ids:
        cards = tuple(
            GpuCard(id=f"{node}-gpu{j}", index=j, vendor="nvidia", model="A100", vram_mb=81_920)
            for j in range(4)
        )
        inv = NodeInventory(hostname=node, memory_mb=65_536, cpu_cores=32.0, gpus=cards)
        events: list[Any] = [NodeRegistered(node_id=node, inventory=inv)]
        if r.random() < 0.3:
            events.append(GpuLost(node_id=node, gpu_id=f"{node}-gpu1", missed_heartbeats=3))
            if r.random() < 0.5:
                events.append(GpuRecovered(node_id=node, gpu_id=f"{node}-gpu1", seen_heartbeats=2))
        if r.random() < 0.1:
            card = f"{node}-gpu3"  # dropped if the node re-registers with two cards below
            events.append(
                CardQuarantined(node_id=node, gpu_id=card, code="xid:79", evidence="XID 79")
            )
            if r.random() < 0.5:
                events.append(CardRestored(node_id=node, gpu_id=card, probes_passed=3))
        if r.random() < 0.2:
            events.append(
                NodeOffline(node_id=node, silent_seconds=12.5, reason_code=ReasonCode.NODE_LOST)
            )
            smaller = inv.model_copy(update={"gpus": cards[:2]})
            events.append(NodeRegistered(node_id=node, inventory=smaller))
        streams.stream(node, events)
    return ids


def _groups_and_jobs(streams: _Streams, tasks: _Tasks, first_task: int, n: int) -> int:
    """`n` groups (two members each) and `n` jobs; returns the next free task number."""
    r = streams.rng
    i = first_task
    for g in range(n):
        gid = f"group-{g:04d}"
        template = TaskSpec(name=f"g{g}", image="vllm/vllm:0.6", gpu_required=1)
        spec = GroupSpec(template=template, shape=GroupShape(task_count=2))
        streams.stream(
            gid,
            [
                GroupCreated(group_id=gid, tenant_id=TenantId("acme"), spec=spec),
                GroupStatusChanged(
                    group_id=gid,
                    from_status=GroupStatus.PENDING,
                    to_status=GroupStatus.RUNNING,
                    reason_code=r.choice(CODES),
                ),
                GroupScaled(
                    group_id=gid, from_replicas=2, to_replicas=3, reason_code=r.choice(CODES)
                ),
                *([GroupDeleted(group_id=gid)] if r.random() < 0.2 else []),
            ],
        )
        for rank in range(2):
            streams.stream(f"task-{i:07d}", tasks.lifecycle(i, (gid, rank)))
            i += 1
        jid = f"job-{g:04d}"
        node_spec = JobNodeSpec(key="train", spec=TaskSpec(name="train", image="busybox:latest"))
        streams.stream(
            jid,
            [
                JobSubmitted(
                    job_id=jid,
                    tenant_id=TenantId("beta"),
                    spec=JobSpec(name=jid, tasks=(node_spec,)),
                ),
                JobTasksReady(job_id=jid, keys=("train",)),
                JobStatusChanged(
                    job_id=jid,
                    from_status=JobStatus.PENDING,
                    to_status=JobStatus.RUNNING,
                    reason_code=r.choice(CODES),
                ),
                JobNodeSettled(
                    job_id=jid,
                    key="train",
                    task_id=f"task-{i:07d}",
                    outcome=NodeState.COMPLETED,
                    metrics={"loss": 0.25},
                ),
                JobStatusChanged(
                    job_id=jid,
                    from_status=JobStatus.RUNNING,
                    to_status=JobStatus.SUCCEEDED,
                    reason_code=r.choice(CODES),
                ),
            ],
        )
    return i


def _pools_and_queues(streams: _Streams, n: int) -> None:
    for k in range(n):
        name = f"pool{k}"
        spec = PoolSpec(name=name, node_selector=NodeSelector(labels={"pool": name}))
        updated = spec.model_copy(update={"description": "resized"})
        streams.stream(
            pool_stream(name),
            [PoolCreated(spec=spec), PoolUpdated(spec=updated)]
            + ([PoolDeleted(name=name)] if k % 3 == 0 else []),
        )
        qname = f"queue{k}"
        qspec = QueueSpec(name=qname, tenant="acme", pools=(name,))
        more = qspec.model_copy(update={"quota": QueueQuota(max_gpus=16), "priority": 2})
        streams.stream(queue_stream(qname), [QueueCreated(spec=qspec), QueueUpdated(spec=more)])


def _tenants(streams: _Streams, n: int) -> None:
    names = ["acme", "beta"] + [f"tenant-{k}" for k in range(n - 2)]
    for k, name in enumerate(names):
        tenant = TenantId(name)
        streams.stream(
            f"tenant-{tenant}",
            [
                TenantCreated(tenant_id=tenant, name=tenant, gpu_quota=8),
                ApiKeyIssued(
                    key_id=f"key-{k}",
                    tenant_id=tenant,
                    name="ci",
                    prefix="hf_ab",
                    key_hash=f"0{k:063x}",
                ),
                TenantUpdated(tenant_id=tenant, suspended=k % 2 == 0),
            ],
        )
        streams.stream(
            f"join-{k}",
            [
                JoinTokenIssued(
                    token_id=f"jt-{k}", prefix="hfj_", key_hash=f"1{k:063x}", expires_at=T0
                ),
                NodeJoined(token_id=f"jt-{k}", node_id=f"joined-{k}"),
            ],
        )
        streams.stream(
            f"system-{k}",
            [
                SystemCredentialIssued(
                    credential_id=f"cred-{k}",
                    role="agent",
                    name=f"joined-{k}",
                    prefix="hfa_",
                    key_hash=f"2{k:063x}",
                    node_id=f"joined-{k}",
                ),
            ],
        )


def generate(target: int = 100_000, seed: int = 11) -> list[Event]:
    """About `target` events (a little more), in store order."""
    rng = random.Random(seed)
    streams = _Streams(rng)
    nodes = _nodes(streams, 200)
    tasks = _Tasks(rng, nodes)
    next_task = _groups_and_jobs(streams, tasks, 0, 150)
    _pools_and_queues(streams, 12)
    _tenants(streams, 10)
    while len(streams.items) < target:
        streams.stream(f"task-{next_task:07d}", tasks.lifecycle(next_task))
        next_task += 1
    return streams.events()
