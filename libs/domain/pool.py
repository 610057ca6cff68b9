"""Resource pools and queues (seed 004): aggregates, their events and their entry rules.

A pool is a named partition of the fleet chosen by a node selector (labels and/or a GPU
type); its capacity is computed from the nodes that match, so a node may belong to several
pools. A queue belongs to one tenant, is bound to pools and carries a quota and a policy:
the scheduler admits a queue's task only while the queue's remaining quota allows it, and
then places it only on nodes of the queue's pools (both must hold).

Streams: `pool-<name>` and `queue-<name>`; the stream id is also the projection row id.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import Code, DomainError
from .events import Payload, register
from .validation import exactly_bool, exactly_int

NAME_PATTERN = r"^[a-z0-9A-Z][a-zA-Z0-9._-]{0,62}$"
QUEUE_PRIORITY_MAX = 1000
# A task created for a job carries the job's id in `spec.platform.job_id` (server-owned); a
# queue's max_running_jobs counts distinct values (a task outside any job is a job of its own).


def pool_stream(name: str) -> str:
    return f"pool-{name}"


def queue_stream(name: str) -> str:
    return f"queue-{name}"


# --- GPU type matching (the task's `gpu_type` and a selector's share one meaning) ----------


@functools.lru_cache(maxsize=4096)
def gpu_type_matches(vendor_name: str, model: str, wanted: str) -> bool:
    """Case-insensitive: "" = any, a vendor name = all its cards, "vendor/model", or a
    substring of the model that does not cut a number ("A100" matches "A100-80GB",
    "A10" does not)."""
    w = wanted.strip().lower()
    if not w:
        return True
    vendor = vendor_name.strip().lower()
    if "/" in w:
        want_vendor, _, want_model = w.partition("/")
        return want_vendor.strip() == vendor and _model_has(model, want_model.strip())
    return w == vendor or _model_has(model, w)


def _model_has(model: str, w: str) -> bool:
    if not w:
        return True
    head = r"(?<!\d)" if w[0].isdigit() else ""
    tail = r"(?!\d)" if w[-1].isdigit() else ""
    return re.search(head + re.escape(w) + tail, model.lower()) is not None


# --- pools ---------------------------------------------------------------------------


class NodeSelector(BaseModel):
    """Which nodes a pool holds: every label must match, and (if set) a card of `gpu_type`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    labels: dict[str, str] = Field(default_factory=dict)
    gpu_type: str = Field(default="", max_length=100)

    def matches(self, labels: Mapping[str, str], cards: Iterable[tuple[str, str]]) -> bool:
        """`cards`: (vendor, model) of the node's cards."""
        if any(labels.get(k) != v for k, v in self.labels.items()):
            return False
        return not self.gpu_type or any(gpu_type_matches(v, m, self.gpu_type) for v, m in cards)


class PoolSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    node_selector: NodeSelector
    description: str = Field(default="", max_length=500)


class PoolCreated(Payload):
    """An operator created (or re-created after a delete) a resource pool."""

    type: ClassVar[str] = "pool_created"
    stream_type: ClassVar[str] = "pool"

    spec: PoolSpec


class PoolUpdated(Payload):
    """The pool's selector or description changed (its name never does)."""

    type: ClassVar[str] = "pool_updated"
    stream_type: ClassVar[str] = "pool"

    spec: PoolSpec


class PoolDeleted(Payload):
    """The pool is gone from queries (refused while a live queue names it)."""

    type: ClassVar[str] = "pool_deleted"
    stream_type: ClassVar[str] = "pool"

    name: str


class Pool(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    spec: PoolSpec
    version: int = 0
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None = None


def evolve_pool(pool: Pool | None, event: Payload, at: datetime, version: int) -> Pool:
    if isinstance(event, PoolCreated):
        return Pool(
            id=pool_stream(event.spec.name),
            spec=event.spec,
            version=version,
            created_at=at,
            updated_at=at,
        )
    if pool is None:
        raise ValueError(f"{event.type} before pool_created")
    if isinstance(event, PoolUpdated):
        return pool.model_copy(update={"spec": event.spec, "version": version, "updated_at": at})
    if isinstance(event, PoolDeleted):
        return pool.model_copy(update={"deleted_at": at, "version": version, "updated_at": at})
    raise ValueError(f"not a pool event: {event.type}")


# --- queues --------------------------------------------------------------------------


class QueuePolicy(StrEnum):
    FIFO = "fifo"  # submission order, whatever the task priority
    PRIORITY = "priority"  # task priority first, then submission order


class QueueQuota(BaseModel):
    """0 = no limit. GPUs are counted over the GPU-holding set of SPEC §1."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_gpus: int = Field(default=0, ge=0, le=1_000_000)
    max_running_jobs: int = Field(default=0, ge=0, le=1_000_000)
    max_running_tasks: int = Field(default=0, ge=0, le=1_000_000)

    _ints = field_validator("max_gpus", "max_running_jobs", "max_running_tasks", mode="before")(
        exactly_int
    )


class QueueSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    tenant: str = Field(min_length=1, max_length=100)
    pools: tuple[str, ...] = Field(default=(), max_length=16)
    quota: QueueQuota = QueueQuota()
    priority: int = Field(default=0, ge=0, le=QUEUE_PRIORITY_MAX)
    policy: QueuePolicy = QueuePolicy.PRIORITY
    default: bool = False  # the tenant's queue for work submitted without `queue`

    _priority = field_validator("priority", mode="before")(exactly_int)
    _default = field_validator("default", mode="before")(exactly_bool)

    @field_validator("pools")
    @classmethod
    def _unique(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(v)) != len(v):
            raise ValueError("pools must not repeat a name")
        return v


class QueueCreated(Payload):
    """An operator created (or re-created after a delete) a queue."""

    type: ClassVar[str] = "queue_created"
    stream_type: ClassVar[str] = "queue"

    spec: QueueSpec


class QueueUpdated(Payload):
    """Quota, pools, priority, policy or the default flag changed (name and tenant never)."""

    type: ClassVar[str] = "queue_updated"
    stream_type: ClassVar[str] = "queue"

    spec: QueueSpec


class QueueDeleted(Payload):
    """The queue takes no new work; what it holds runs on."""

    type: ClassVar[str] = "queue_deleted"
    stream_type: ClassVar[str] = "queue"

    name: str


class Queue(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    spec: QueueSpec
    version: int = 0
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None = None


def evolve_queue(queue: Queue | None, event: Payload, at: datetime, version: int) -> Queue:
    if isinstance(event, QueueCreated):
        return Queue(
            id=queue_stream(event.spec.name),
            spec=event.spec,
            version=version,
            created_at=at,
            updated_at=at,
        )
    if queue is None:
        raise ValueError(f"{event.type} before queue_created")
    if isinstance(event, QueueUpdated):
        return queue.model_copy(update={"spec": event.spec, "version": version, "updated_at": at})
    if isinstance(event, QueueDeleted):
        return queue.model_copy(update={"deleted_at": at, "version": version, "updated_at": at})
    raise ValueError(f"not a queue event: {event.type}")


register(PoolCreated, PoolUpdated, PoolDeleted, QueueCreated, QueueUpdated, QueueDeleted)


# --- entry rules ---------------------------------------------------------------------


def _parse(model: type[BaseModel], raw: Any, fixed: Mapping[str, Any]) -> Any:
    if not isinstance(raw, Mapping):
        raise DomainError(Code.INVALID_VALUE, "request body must be a JSON object", ["body"])
    unknown = sorted(set(raw) - set(model.model_fields))
    if unknown:
        raise DomainError(Code.UNKNOWN_FIELD, f"unknown field(s): {', '.join(unknown)}", unknown)
    changed = sorted(k for k, v in fixed.items() if k in raw and raw[k] != v)
    if changed:
        raise DomainError(
            Code.INVALID_VALUE, f"cannot change {', '.join(changed)} of an existing one", changed
        )
    try:
        return model.model_validate({**raw, **fixed}, strict=False)
    except ValidationError as exc:
        raise _refusal(exc) from None


def _refusal(exc: ValidationError) -> DomainError:
    """Unknown nested fields (40001) first, each named; else every invalid value (40003)."""
    errors = exc.errors()
    extra = sorted(
        {".".join(str(p) for p in e["loc"]) for e in errors if e["type"] == "extra_forbidden"}
    )
    if extra:
        return DomainError(Code.UNKNOWN_FIELD, f"unknown field(s): {', '.join(extra)}", extra)
    fields, parts = [], []
    for err in errors:
        name = ".".join(str(p) for p in err["loc"]) or "body"
        fields.append(name)
        parts.append(f"{name}: {str(err['msg']).removeprefix('Value error, ')}")
    return DomainError(
        Code.INVALID_VALUE, "invalid value: " + "; ".join(parts), sorted(set(fields))
    )


def parse_pool(raw: Any, *, name: str | None = None) -> PoolSpec:
    """A create body (`name` None) or a full update body of pool `name`."""
    spec: PoolSpec = _parse(PoolSpec, raw, {"name": name} if name else {})
    return spec


def parse_queue(raw: Any, *, current: QueueSpec | None = None) -> QueueSpec:
    """A create body, or a full update body of `current` (name and tenant are fixed)."""
    fixed = {"name": current.name, "tenant": current.tenant} if current else {}
    spec: QueueSpec = _parse(QueueSpec, raw, fixed)
    if not spec.pools:
        raise DomainError(Code.INVALID_VALUE, "a queue names at least one pool", ["pools"])
    return spec
