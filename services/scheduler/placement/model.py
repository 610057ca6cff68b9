"""The scheduler's inputs and outputs: an immutable cluster snapshot in, a plan out.

Everything here is a frozen value. The control plane builds a `ClusterSnapshot` from the
node inventory and the tasks in `GPU_HOLDING` (libs.domain.states), plus `PendingTask`s
for the tasks waiting in `pending`; `planner.plan` returns a `Plan` that the control plane
commits through the transition whitelist. Nothing in this package performs I/O or reads
the clock: `ClusterSnapshot.now` is the only time the scheduler knows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType

from libs.domain.node.model import DEFAULT_PORT_RANGE
from libs.domain.pool.model import gpu_type_matches
from libs.domain.reasons import ReasonCode
from libs.domain.task.lending import lendable
from libs.domain.task.model import Task, TaskSpec, TaskType
from libs.domain.task.states import GPU_HOLDING, TaskStatus
from libs.domain.task.variants import placed_spec, variant_label, variant_spec

from .reasons import Reason


class Qos(StrEnum):
    """Isolation class of a fractional GPU share, derived on placement (SPEC §3)."""

    GOLD = "gold"  # NVIDIA with MIG mode enabled: a hardware instance
    SILVER = "silver"  # other NVIDIA: MPS
    BRONZE = "bronze"  # every other vendor: software accounting only


@dataclass(frozen=True, slots=True)
class Gpu:
    id: str  # card uuid, or "<node>-gpu<index>" when the agent has none
    index: int
    vendor: str  # "nvidia", "amd", "huawei", "intel", ...
    model: str  # "A100-80GB", "RTX4090", "MI300X", "Ascend910B", ...
    vram_mb: int
    mig_capable: bool = False
    mig_enabled: bool = False  # capable is not enough: gold needs MIG mode on
    excluded: bool = False  # GPU_LOST: kept out of new placements until seen again


def derive_qos(gpu: Gpu) -> Qos:
    if gpu.vendor.lower() == "nvidia":
        return Qos.GOLD if gpu.mig_enabled else Qos.SILVER
    return Qos.BRONZE


def gpu_matches(gpu: Gpu, wanted: str) -> bool:
    """Case-insensitive: "" = any, a vendor name = all its cards, "vendor/model", or a
    substring of the model that does not cut a number ("A100" matches "A100-80GB",
    "A10" does not)."""
    return not wanted or _type_matches(gpu.vendor, gpu.model, wanted)


def _type_matches(vendor_name: str, model: str, wanted: str) -> bool:
    # One meaning for a task's gpu_type and a pool's selector (cached there: a fleet has few
    # distinct (vendor, model, wanted) triples and every node check hits this).
    return gpu_type_matches(vendor_name, model, wanted)


CardSets = tuple[tuple[Gpu, ...], tuple[Gpu, ...]]


@dataclass(frozen=True, slots=True)
class Node:
    id: str
    online: bool
    memory_mb: int
    cpu_cores: float
    gpus: tuple[Gpu, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    runtime: str = ""  # the agent's runtime: docker, process, simulated ("" = not reported)
    pools: frozenset[str] = frozenset()  # resource pools whose selector the node matches
    # Tasks it may have scheduled or starting (placed, not yet running) at once; 0 = no bound.
    # The scheduler's setting, not the agent's: a burst waits or spreads instead of queueing
    # on one agent's command stream.
    max_starting: int = 0
    # The address it advertises, the machine it runs on ("" = its own id) and the host ports
    # the scheduler allocates there (docs/groups.md#how-members-reach-each-other).
    address: str = ""
    host_id: str = ""
    port_range: tuple[int, int] = DEFAULT_PORT_RANGE
    # Memo for cards_for: the answer depends only on the (immutable) cards, and the planner
    # asks once per task and node. Not part of the value.
    _cards_memo: dict[tuple[str, int, int], CardSets] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def host(self) -> str:
        """The machine: nodes with the same host share its ports and its loopback."""
        return self.host_id or self.id

    def cards_for(self, gpu_type: str, min_vram_mb: int = 0, fraction_vram_mb: int = 0) -> CardSets:
        """(cards of `gpu_type`, those with more than `min_vram_mb` and at least
        `fraction_vram_mb` VRAM, smallest first); lost cards are left out of both."""
        key = (gpu_type, min_vram_mb, fraction_vram_mb)
        hit = self._cards_memo.get(key)
        if hit is None:
            typed = tuple(g for g in self.gpus if not g.excluded and gpu_matches(g, gpu_type))
            # Smallest sufficient card first: best fit leaves big cards for big requests.
            big = tuple(
                sorted(
                    (g for g in typed if g.vram_mb > min_vram_mb and g.vram_mb >= fraction_vram_mb),
                    key=lambda g: (g.vram_mb, g.index),
                )
            )
            hit = self._cards_memo[key] = (typed, big)
        return hit


@dataclass(frozen=True, slots=True)
class GpuShare:
    """A fraction of one card: the VRAM and the compute share it holds."""

    gpu_id: str
    vram_mb: int
    compute_ratio: float


@dataclass(frozen=True, slots=True)
class Requirement:
    """What a task needs from a node, taken from its TaskSpec."""

    gpu_count: int = 0  # whole cards
    gpu_type: str = ""  # "", a vendor, a model substring, or "vendor/model"
    gpu_memory_mb: int = 0  # fraction: VRAM on one card
    gpu_compute_ratio: float = 0.0  # fraction: compute share of one card
    memory_mb: int = 2048
    cpu_cores: float = 1.0
    requested_node_id: str = ""
    anti_affinity: tuple[str, ...] = ()
    runtime: str = ""  # the node runtime required; "" = any (see TaskSpec.needs_runtime)

    @property
    def is_fractional(self) -> bool:
        return self.gpu_count == 0 and (self.gpu_memory_mb > 0 or self.gpu_compute_ratio > 0)

    @property
    def needs_gpu(self) -> bool:
        return self.gpu_count > 0 or self.is_fractional

    @classmethod
    def from_spec(cls, spec: TaskSpec) -> Requirement:
        return cls(
            gpu_count=spec.gpu_required,
            gpu_type=spec.gpu_type.strip(),
            gpu_memory_mb=0 if spec.gpu_required else spec.gpu_memory_mb,
            gpu_compute_ratio=0.0 if spec.gpu_required else spec.gpu_compute_ratio,
            memory_mb=spec.memory_mb,
            cpu_cores=spec.cpu_cores,
            requested_node_id=spec.requested_node_id,
            anti_affinity=tuple(spec.anti_affinity),
            runtime=spec.needs_runtime,
        )

    @classmethod
    def for_task(cls, task: Task, spec: TaskSpec | None = None) -> Requirement:
        """`from_spec` (of `spec`, by default the task's) plus the constraints a task's group
        adds (see `spread_key`)."""
        req = cls.from_spec(task.spec if spec is None else spec)
        key = spread_key(task)
        if key:
            return replace(req, anti_affinity=(*req.anti_affinity, key))
        return req


# Seed 000: a training group runs one container per node. Its members carry this
# anti-affinity key without the user naming one, so a gang never doubles up on a node.
SPREAD_KEY_PREFIX = "heteroflow.training-group:"


def spread_key(task: Task) -> str:
    """The implicit anti-affinity key of a training group's member, "" for any other task."""
    if task.group_id and task.spec.task_type is TaskType.TRAINING:
        return SPREAD_KEY_PREFIX + task.group_id
    return ""


def share_on(req: Requirement, gpu: Gpu) -> GpuShare:
    """The share a fractional request holds on `gpu`.

    A request naming only one dimension holds the matching share of the other, so every
    fraction is accounted in both VRAM and compute and a card is never oversubscribed.
    """
    vram = req.gpu_memory_mb or math.ceil(req.gpu_compute_ratio * gpu.vram_mb)
    ratio = req.gpu_compute_ratio or min(1.0, vram / gpu.vram_mb)
    return GpuShare(gpu_id=gpu.id, vram_mb=vram, compute_ratio=ratio)


@dataclass(frozen=True, slots=True)
class Allocation:
    """Resources a task holds now. Only statuses in GPU_HOLDING hold anything."""

    task_id: str
    tenant_id: str
    node_id: str
    status: TaskStatus
    gpu_ids: tuple[str, ...] = ()
    fractions: tuple[GpuShare, ...] = ()  # non-empty: gpu_ids are shared, not whole
    memory_mb: int = 0
    cpu_cores: float = 0.0
    priority: int = 0
    preemptible: bool = False
    anti_affinity: tuple[str, ...] = ()
    queue: str = ""  # "" = no queue
    job: str = ""  # the job it belongs to, "" = none (it counts as a job of its own)
    # Card lending (libs/domain/task/lending.py): a sleeper whose cards may be lent, and on a
    # borrower the lender whose cards it runs on (counted once, on the lender).
    lendable: bool = False
    borrowed_from: str = ""
    ports: tuple[int, ...] = ()  # host ports allocated with the placement

    @property
    def holding(self) -> bool:
        return self.status in GPU_HOLDING

    @property
    def is_fractional(self) -> bool:
        return bool(self.fractions)

    @classmethod
    def from_task(cls, task: Task, gpus: Mapping[str, Gpu]) -> Allocation:
        """Build from a placed task; `gpus` (by id) lets a fraction be re-derived per card.

        A fractional task whose card is missing from `gpus` is counted as holding the whole
        card: too much rather than too little. A task with variants counts its placed one.
        """
        req = Requirement.for_task(task, placed_spec(task))
        fractions: tuple[GpuShare, ...] = ()
        if req.is_fractional:
            fractions = tuple(share_on(req, gpus[g]) for g in task.gpu_ids if g in gpus)
        return cls(
            task_id=task.id,
            tenant_id=task.tenant_id,
            node_id=task.node_id or "",
            status=task.status,
            gpu_ids=task.gpu_ids,
            fractions=fractions,
            memory_mb=req.memory_mb,
            cpu_cores=req.cpu_cores,
            priority=task.spec.priority,
            preemptible=task.spec.preemptible,
            anti_affinity=req.anti_affinity,
            queue=task.spec.queue,
            job=task.spec.platform.job_id,
            lendable=lendable(task),
            borrowed_from=task.borrowed_from,
            ports=tuple(task.ports.values()),
        )

    @property
    def job_key(self) -> str:
        return self.job or self.task_id


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """A queue as admission sees it: its quota (0 = no limit), its pools and its order."""

    name: str
    pools: frozenset[str] = frozenset()
    max_gpus: int = 0
    max_running_jobs: int = 0
    max_running_tasks: int = 0
    priority: int = 0
    fifo: bool = False  # submission order inside the queue, whatever the task priority


@dataclass(frozen=True, slots=True)
class PendingTask:
    """A task waiting for a node, with the constraints retry and grouping add to its spec."""

    task_id: str
    tenant_id: str
    requirement: Requirement
    created_at: datetime  # FIFO within one priority
    priority: int = 0
    excluded_node_ids: frozenset[str] = frozenset()  # retry: avoid these nodes
    required_min_vram_mb: int = 0  # GPU OOM retry: cards must have MORE VRAM than this
    same_node_id: str = ""  # retry on the same node
    not_before: datetime | None = None  # backoff
    gang_id: str | None = None  # members are placed all together or not at all
    gang_size: int = 0  # members expected; 0 = whatever is pending
    queue: str = ""  # "" = no queue: only the tenant quota applies
    job: str = ""
    task_type: str = ""  # a training task may borrow a sleeping task's card (lending)
    # A new-generation replica of a rolling update may take the tenant past its GPU quota
    # by at most this many cards (the surge replicas' cards; SPEC §5, docs/rollout.md).
    surge_cards: float = 0.0
    # Host ports (docs/groups.md): `master_port` None = none wanted, 0 = allocate one, else
    # that port pinned (rank 0 of a static-world group); `host_network`: a static-world
    # member; `serves`: a serving port is declared (allocated on a process node or with
    # host networking, where no port mapping applies).
    master_port: int | None = None
    host_network: bool = False
    serves: bool = False
    # Filled from the queue by the planner (queues.py): where it may go and how it ranks.
    pools: frozenset[str] = frozenset()  # empty = any node
    queue_priority: int = 0
    fifo: bool = False
    # Its variants (docs/scheduling.md#variants), tried in order by the planner; empty: the
    # requirement alone. `variant_floor`: a GPU OOM retry of the variant of this index moves
    # past it, so the waits of it and every earlier one count as run out (-1: none).
    variants: tuple[Variant, ...] = ()
    variant_floor: int = -1
    # Its group (every member runs one variant): the variant the group's placed members
    # run (None: none placed), and the group's id for members placed in the same round.
    variant_pin: int | None = None
    variant_group: str = ""
    # Requeued after a device fault (the card's failure, not the task's): placed ahead of the
    # pending work of its priority class, Slurm's expedited requeue
    # (docs/operations.md#device-faults-and-card-quarantine).
    expedited: bool = False

    @property
    def job_key(self) -> str:
        return self.job or self.task_id

    @property
    def pins(self) -> tuple[str, ...]:
        return tuple(n for n in (self.requirement.requested_node_id, self.same_node_id) if n)

    @classmethod
    def from_task(
        cls,
        task: Task,
        *,
        excluded_node_ids: frozenset[str] = frozenset(),
        required_min_vram_mb: int = 0,
        same_node_id: str = "",
        not_before: datetime | None = None,
        gang_id: str | None = None,
        gang_size: int = 0,
        master_port: int | None = None,
        host_network: bool = False,
    ) -> PendingTask:
        return cls(
            task_id=task.id,
            tenant_id=task.tenant_id,
            requirement=Requirement.for_task(task),
            created_at=task.created_at,
            priority=task.spec.priority,
            excluded_node_ids=excluded_node_ids,
            required_min_vram_mb=required_min_vram_mb,
            same_node_id=same_node_id,
            not_before=not_before,
            gang_id=gang_id,
            gang_size=gang_size,
            queue=task.spec.queue,
            job=task.spec.platform.job_id,
            task_type=task.spec.task_type.value,
            surge_cards=_surge(task),
            master_port=master_port,
            host_network=host_network,
            serves=task.spec.serving is not None,
            variants=variants_of(task),
            variant_group=task.group_id or "" if task.spec.variants else "",
            variant_floor=task.variant if task.variant is not None and task.min_vram_mb else -1,
            expedited=task.status_reason_code is ReasonCode.DEVICE_REQUEUE,
        )


@dataclass(frozen=True, slots=True, eq=False)
class AllocationDelta:
    """How `allocations` (a snapshot's tuple, by identity) differs from `since` (an earlier
    snapshot's tuple from the same source): the allocations of the tasks that are new or
    moved, and the tasks that hold nothing now. A planner whose ledger was brought to `since`
    applies it instead of scanning every allocation (ledger.py `apply`)."""

    since: tuple[Allocation, ...]
    allocations: tuple[Allocation, ...]
    changed: tuple[Allocation, ...] = ()
    gone: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """The cluster as one evaluation sees it. Quotas are in cards; 0 or absent = unlimited.
    `delta`, when its source knows it, says what changed since an earlier snapshot; it is
    used only while `allocations` is the very tuple it was made for (a copy with other
    allocations keeps a delta that no longer applies, and it is then ignored)."""

    now: datetime
    nodes: tuple[Node, ...] = ()
    allocations: tuple[Allocation, ...] = ()
    tenant_quotas: Mapping[str, float] = field(default_factory=dict)
    queues: Mapping[str, QueueLimits] = field(default_factory=dict)
    delta: AllocationDelta | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tenant_quotas", MappingProxyType(dict(self.tenant_quotas)))
        object.__setattr__(self, "queues", MappingProxyType(dict(self.queues)))

    def holding(self) -> tuple[Allocation, ...]:
        return tuple(a for a in self.allocations if a.holding)

    def quota_of(self, tenant_id: str) -> float:
        return self.tenant_quotas.get(tenant_id, 0.0)

    def gpus_by_id(self) -> dict[str, Gpu]:
        return {g.id: g for n in self.nodes for g in n.gpus}


@dataclass(frozen=True, slots=True)
class Placement:
    task_id: str
    node_id: str
    gpu_ids: tuple[str, ...] = ()
    qos: Qos | None = None  # set for fractions only; whole cards are exclusive
    fractions: tuple[GpuShare, ...] = ()
    gpu_label: str = ""  # "vendor/model" of the granted cards: the agent's engine routing
    variant: int | None = None  # the index of the task's variant placed (None: no variants)
    ports: Mapping[str, int] = field(default_factory=dict)  # host ports, by name
    # The chosen node's named scores (rankers.py), "why this node"; not part of the decision.
    scores: Mapping[str, float] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class Preemption:
    """Evict `victims` (preempting -> pending) so `task_id` fits on `node_id` next round."""

    task_id: str
    node_id: str
    victims: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Unplaced:
    task_id: str
    reason: Reason
    message: str

    @property
    def text(self) -> str:
        """The "why pending" line a user sees: `<reason>: <message>`."""
        return f"{self.reason.value}: {self.message}"


@dataclass(frozen=True, slots=True)
class Plan:
    """The outcome of one evaluation.

    Every task considered appears exactly once in `placements` or `unplaced`; a task that
    asked for a preemption is also in `unplaced` (it waits for the capacity to free).
    `deferred` lists tasks beyond `max_batch`, left untouched for the next round.
    """

    placements: tuple[Placement, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    unplaced: tuple[Unplaced, ...] = ()
    deferred: tuple[str, ...] = ()

    def placement_for(self, task_id: str) -> Placement | None:
        return next((p for p in self.placements if p.task_id == task_id), None)

    def unplaced_for(self, task_id: str) -> Unplaced | None:
        return next((u for u in self.unplaced if u.task_id == task_id), None)


def _surge(task: Task) -> float:
    """The surge allowance the rollout controller gave a new replica (0: none). Server-owned
    (`spec.platform`): no label of the tenant's reads as one."""
    return task.spec.platform.surge_cards


@dataclass(frozen=True, slots=True)
class Variant:
    """One of a task's variants as placement sees it: its index, what it needs, how long
    (from the task's submission) it is waited for before the next one is considered too."""

    index: int
    requirement: Requirement
    wait_s: float = 0.0
    label: str = ""  # how a reason names it (libs/domain/task/variants.py: variant_label)


def variants_of(task: Task) -> tuple[Variant, ...]:
    """The task's variants, each with the requirement its own spec gives (`variant_spec`)."""
    return tuple(
        Variant(
            i, Requirement.for_task(task, variant_spec(task.spec, i)), v.wait_s, variant_label(v)
        )
        for i, v in enumerate(task.spec.variants)
    )
