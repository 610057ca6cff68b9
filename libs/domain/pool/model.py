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

from pydantic import BaseModel, ConfigDict, Field, field_validator

from libs.domain.validation import exactly_bool, exactly_int

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


class Pool(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    spec: PoolSpec
    version: int = 0
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None = None


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


class Queue(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    spec: QueueSpec
    version: int = 0
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None = None
