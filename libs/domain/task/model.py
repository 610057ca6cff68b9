"""Task configuration (what a user asks for) and task state (what the events say).

`parse_create` and `parse_update` hold the entry discipline of SPEC §2: every unknown field is
named, server-owned fields are refused, values are checked, and nothing is silently dropped.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, NewType

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from libs.domain.errors import Code, DomainError
from libs.domain.group.serving import ServingSpec, looks_like_inference
from libs.domain.reasons import ReasonCode
from libs.domain.task.boost import DEFAULT_MEMORY_MB, boost_memory
from libs.domain.task.states import TaskStatus
from libs.domain.validation import (
    RESERVED_LABEL_PREFIX,
    check_task_spec,
    exactly_bool,
    exactly_int,
    is_integer,
)

TaskId = NewType("TaskId", str)
TenantId = NewType("TenantId", str)
NodeId = NewType("NodeId", str)

TENANT_MAX_PRIORITY = 70
SYSTEM_PRIORITY = 100
NAME_MAX = 100
RESERVED_ENV_PREFIX = "HETEROFLOW_"


class RetryStrategy(StrEnum):
    RETRY_NEW_NODE = "retry_new_node"
    RETRY_SAME_NODE = "retry_same_node"
    NO_RETRY = "no_retry"


class TaskType(StrEnum):
    TRAINING = "training"
    INFERENCE = "inference"
    BATCH = "batch"
    UNSET = ""


class Volume(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    host_path: str = Field(min_length=1)
    container_path: str = Field(min_length=1)
    read_only: bool = False

    _read_only = field_validator("read_only", mode="before")(exactly_bool)

    @field_validator("container_path")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("container_path must be absolute")
        return v


class Platform(BaseModel):
    """What the platform records about a task it created for one of its own aggregates
    (docs/api.md#reserved-names): never sent by a client (`platform` is server-owned), set
    only where the platform builds the spec (a job's task, a group member, a rollout's
    replica). Label keys under `heteroflow.` are refused at entry, so no tenant label can
    stand in for these."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The job (stream `job-…`) and the node of its DAG this task was created for.
    job_id: str = ""
    job_key: str = ""
    # Cards a rolling update's new replica may hold over its tenant's GPU quota.
    surge_cards: float = Field(default=0.0, ge=0)
    # A member of a static-world group (training, TP/PP): one rank cannot rejoin alone.
    static_world: bool = False


# The label keys the platform wrote before `Platform` existed (upcast on load, `upcast_spec`).
LEGACY_JOB_LABEL = "heteroflow.job"
LEGACY_JOB_KEY_LABEL = "heteroflow.job_key"
LEGACY_SURGE_LABEL = "heteroflow.rollout_surge_cards"
LEGACY_STATIC_WORLD_LABEL = "heteroflow.static_world"
LEGACY_RANK_LABEL = "heteroflow.rank"
_SURGE_TEXT = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def upcast_spec(spec: Any, *, grouped: bool) -> Any:
    """A stored spec (a dict) whose labels still carry the platform's legacy keys: those
    keys removed, their values in `platform` (`grouped`: the task is a group member, the only
    kind a surge or a static world was ever written for). Anything else is returned as is.
    Mirrored in SQL by migration 12 (libs/store/migrations.py): keep the two equal."""
    if not isinstance(spec, dict) or "platform" in spec:
        return spec
    labels = spec.get("labels")
    if not isinstance(labels, dict):
        return spec
    surge = labels.get(LEGACY_SURGE_LABEL, "")
    platform = {
        "job_id": str(labels.get(LEGACY_JOB_LABEL, "")),
        "job_key": str(labels.get(LEGACY_JOB_KEY_LABEL, "")),
        "surge_cards": float(surge)
        if grouped and isinstance(surge, str) and _SURGE_TEXT.fullmatch(surge)
        else 0.0,
        "static_world": grouped and labels.get(LEGACY_STATIC_WORLD_LABEL) == "true",
    }
    kept = {k: v for k, v in labels.items() if not str(k).startswith(RESERVED_LABEL_PREFIX)}
    return spec | {"labels": kept, "platform": platform}


def upcast_task_doc(data: Any) -> Any:
    """A stored task document or `task_created` payload (a dict holding `spec` and
    `group_id`) written before `Platform`: its spec upcast (`upcast_spec`). Anything else is
    returned as is."""
    spec = data.get("spec") if isinstance(data, dict) else None
    if isinstance(spec, dict) and "platform" not in spec:
        return data | {"spec": upcast_spec(spec, grouped=data.get("group_id") is not None)}
    return data


# At most this many variants per task (docs/scheduling.md#variants), each waited for at most
# a week before the next one is considered.
VARIANTS_MAX = 8
VARIANT_WAIT_MAX_S = 7 * 86_400


def _exact_number(value: Any) -> Any:
    # Lax validation would take "0.5" or true where the document says number.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a number")
    return value


class TaskVariant(BaseModel):
    """One way to run a task (docs/scheduling.md#variants): its cards and what runs on them.

    A variant names its cards in full (`gpu_type`, whole cards or a fraction; none = CPU
    only); `image` and `command` left empty are the task's own, `env` is laid over the
    task's. `wait_s`: how long after the task's submission this variant (with every earlier
    one) is waited for before the next one is considered too; the last one's is not read."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_type: str = ""
    gpu_required: int = Field(default=0, ge=0, le=64)
    gpu_memory_mb: int = Field(default=0, ge=0)
    gpu_compute_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    image: str = Field(default="", max_length=512)
    command: str = ""
    env: dict[str, str] = Field(default_factory=dict)
    wait_s: float = Field(default=0.0, ge=0, le=VARIANT_WAIT_MAX_S)

    _ints = field_validator("gpu_required", "gpu_memory_mb", mode="before")(exactly_int)
    _numbers = field_validator("gpu_compute_ratio", "wait_s", mode="before")(_exact_number)

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> dict[str, str]:
        if v is None:  # as for the task's own env: omit it rather than send null
            raise ValueError("env must be a list of KEY=VALUE strings or a map, not null")
        return normalise_env(v)

    @property
    def is_fractional(self) -> bool:
        return self.gpu_memory_mb > 0 or self.gpu_compute_ratio > 0


class TaskSpec(BaseModel):
    """The user-owned configuration of a task, validated and normalised."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=NAME_MAX)
    # Empty: no image, the task runs as a plain process and only on a `process` node.
    image: str = Field(default="", max_length=512)
    command: str = ""
    gpu_required: int = Field(default=0, ge=0, le=64)
    gpu_type: str = ""
    gpu_memory_mb: int = Field(default=0, ge=0)
    gpu_compute_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    memory_mb: int = Field(default=DEFAULT_MEMORY_MB, gt=0, le=4 * 1024 * 1024)
    cpu_cores: float = Field(default=1.0, gt=0, le=1024)
    priority: int = Field(default=0, ge=0, le=SYSTEM_PRIORITY)
    preemptible: bool = False
    timeout: int = Field(default=0, ge=0)
    max_retries: int = Field(default=3, ge=0, le=100)
    retry_strategy: RetryStrategy = RetryStrategy.RETRY_NEW_NODE
    env: dict[str, str] = Field(default_factory=dict)
    volumes: tuple[Volume, ...] = ()
    labels: dict[str, str] = Field(default_factory=dict)
    task_type: TaskType = TaskType.UNSET
    requested_node_id: str = ""
    anti_affinity: tuple[str, ...] = ()
    idle_timeout_minutes: int = Field(default=0, ge=0)
    # An HTTP server the router may send traffic to (inference; docs/serving.md).
    serving: ServingSpec | None = None
    # Per-task overrides of the retry engine's defaults (None = the configured default).
    retry_delay: float | None = Field(default=None, ge=0, le=86_400)
    backoff_multiplier: float | None = Field(default=None, ge=1, le=10)
    oom_memory_limit: int | None = Field(default=None, gt=0)
    # The queue the task waits in ("" = the tenant's default queue, or none: seed 004).
    queue: str = Field(default="", max_length=64)
    # Ways to run it, in order of preference (docs/scheduling.md#variants); empty = the
    # top-level fields alone. With variants the cards are the variants' (top level: none).
    variants: tuple[TaskVariant, ...] = Field(default=(), max_length=VARIANTS_MAX)
    # Server-owned: what the platform records about a task it created (`Platform`).
    platform: Platform = Platform()

    @field_validator("name")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank")
        return v

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        if v and not v.strip():
            raise ValueError("must not be blank (omit it to run a plain process)")
        return v

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> dict[str, str]:
        return normalise_env(v)

    @field_validator("anti_affinity", mode="before")
    @classmethod
    def _anti(cls, v: Any) -> Any:
        if isinstance(v, str):
            return (v,) if v else ()
        return v

    @property
    def is_fractional(self) -> bool:
        return self.gpu_memory_mb > 0 or self.gpu_compute_ratio > 0

    @property
    def uses_gpu(self) -> bool:
        """Whole cards or a fraction of one."""
        return self.gpu_required > 0 or self.is_fractional

    @property
    def is_inference(self) -> bool:
        """`task_type` is authoritative; only "" falls back to the heuristic of
        `looks_like_inference` (an inference image name or a declared serving port)."""
        if self.task_type is not TaskType.UNSET:
            return self.task_type is TaskType.INFERENCE
        return looks_like_inference(self.image, self.serving)

    @property
    def needs_runtime(self) -> str:
        """The node runtime this task requires: `process` without an image, else any ("")."""
        return "" if self.image else "process"


class RetryVerdict(BaseModel):
    """The retry engine's last decision on a failure of the task (`task_retry_decided`):
    `retry` (it runs again), `give_up` (it will not: a permanent failure, retries used up or
    `no_retry`) or `hold`, with why. Folded from the event, so replay gives it back."""

    model_config = ConfigDict(frozen=True)

    verdict: Literal["retry", "give_up", "hold", "requeue"]
    reason: str
    failure_class: str  # permanent, transient, cpu_oom, gpu_oom, other
    attempt: int  # the attempt decided on (the task's retry_count then)
    decided_at: datetime


class Task(BaseModel):
    """A task as its events made it. Projections store exactly this document."""

    model_config = ConfigDict(frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _upcast(cls, data: Any) -> Any:
        # A document stored before `Platform`: the platform's labels move into it.
        return upcast_task_doc(data)

    id: TaskId
    tenant_id: TenantId
    spec: TaskSpec
    status: TaskStatus = TaskStatus.PENDING
    version: int = 0
    node_id: str | None = None
    gpu_ids: tuple[str, ...] = ()
    qos: str = ""
    container_id: str = ""
    # host:port of the task's serving port, as its agent reported it (docs/serving.md).
    serve_address: str = ""
    # "vendor/model" of its cards, set on placement, and the engine profile the agent chose
    # from it and the image (docs/serving.md#engine-routing).
    gpu_label: str = ""
    engine: str = ""
    # The index in `spec.variants` of its current (or last) placement; None: no variants,
    # or never placed (docs/scheduling.md#variants).
    variant: int | None = None
    # Host ports the scheduler allocated with the placement, by name: "master" (rank 0 of a
    # static-world group) and "serve" (a replica without port mapping); docs/groups.md.
    ports: dict[str, int] = Field(default_factory=dict)
    retry_count: int = 0
    # Requeues after a device fault (the card's failure, not the task's): they spend none of
    # `max_retries`, but each is a new attempt (`attempt`), so a run is never confused with
    # the one its card ended (docs/operations.md#device-faults-and-card-quarantine).
    requeues: int = 0
    exit_code: int | None = None
    result: str = ""
    error: str = ""
    pending_reason: str = ""
    pending_reason_code: ReasonCode | None = None
    # Why the last status change was made (the code of its event, and its text).
    status_reason_code: ReasonCode = ReasonCode.UNSPECIFIED
    status_reason: str = ""
    # The retry engine's last verdict on a failure (None: it never failed); a `failed` task
    # with `give_up` is failed for good, without a state of its own.
    retry: RetryVerdict | None = None
    # Placement constraints set by the retry engine for the next attempt.
    not_before: datetime | None = None
    same_node_id: str = ""
    avoid_node_ids: tuple[str, ...] = ()
    min_vram_mb: int = 0
    group_id: str | None = None
    rank: int | None = None
    # Rolling update (docs/rollout.md): the group generation this replica was created for,
    # and whether a rollout has marked it to drain (no new requests, then `cancelled`).
    generation: int = 0
    draining: bool = False
    # Card lending (docs/serving.md#card-lending): the last sleep released the card's memory
    # (measured, libs/domain/task/lending.py), the task its card is lent to, a wake that waits for
    # that borrower to end; on a borrower, the sleeping task whose card it runs on.
    sleep_released: bool = False
    lent_to: str = ""
    wake_queued: bool = False
    borrowed_from: str = ""
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    deleted_at: datetime | None = None

    @property
    def attempt(self) -> int:
        """The attempt's identity on the node and in reports: retries plus device requeues."""
        return self.retry_count + self.requeues


# Fields a client may send on create. `gpu_count` is the V2 alias of `gpu_required`.
CREATE_FIELDS: frozenset[str] = frozenset(TaskSpec.model_fields) - {"platform"} | {"gpu_count"}

# Server-owned: set by the platform, never by a create/update request (non-zero -> 40002).
SERVER_OWNED: frozenset[str] = frozenset(
    {
        "id",
        "tenant_id",
        "group_id",
        "rank",
        "gpu_id",
        "gpu_ids",
        "retry_count",
        "requeues",
        "result",
        "status",
        "node_id",
        "exit_code",
        "qos",
        "container_id",
        "serve_address",
        "gpu_label",
        "engine",
        "variant",
        "ports",
        "error",
        "pending_reason",
        "pending_reason_code",
        "status_reason_code",
        "status_reason",
        "retry",
        "version",
        "created_at",
        "updated_at",
        "started_at",
        "finished_at",
        "deleted_at",
        "generation",
        "draining",
        "not_before",
        "same_node_id",
        "avoid_node_ids",
        "min_vram_mb",
        "platform",
    }
)

# Execution-report fields: tenants get 403 for these on update; agents/operators may report.
REPORT_FIELDS: frozenset[str] = frozenset(
    {"status", "result", "exit_code", "error", "node_id", "container_id", "finished_at"}
)

# Fields whose null means "the configured default" (name: null is reported as missing; image:
# null is no image, like an omitted one).
NULLABLE: frozenset[str] = frozenset(
    {"name", "image", "retry_delay", "backoff_multiplier", "oom_memory_limit", "serving"}
)

# Fields whose default is configuration (HETEROFLOW_RETRY_MAX_RETRIES, ..._DEFAULT_STRATEGY).
CONFIGURED_DEFAULTS: frozenset[str] = frozenset({"max_retries", "retry_strategy"})

# The only config field a tenant may change after `pending`.
ANYTIME_FIELDS: frozenset[str] = frozenset({"idle_timeout_minutes"})


def _is_zero(value: Any) -> bool:
    return value is None or value == 0 or value == "" or value is False or value in ([], {})


def normalise_env(v: Any) -> dict[str, str]:
    """Accept `["K=V", ...]` or `{"K": "V"}`; refuse malformed entries rather than drop them."""
    if v is None:
        return {}
    pairs: Iterable[tuple[str, Any]]
    if isinstance(v, Mapping):
        pairs = v.items()
    elif isinstance(v, list):
        out: list[tuple[str, Any]] = []
        for item in v:
            if not isinstance(item, str) or "=" not in item:
                raise ValueError(f"env entry {item!r} is not of the form KEY=VALUE")
            key, _, val = item.partition("=")
            out.append((key, val))
        pairs = out
    else:
        raise ValueError("env must be a list of KEY=VALUE strings or a map")
    env: dict[str, str] = {}
    for key, val in pairs:
        if not isinstance(key, str) or not key or "\x00" in key or "=" in key:
            raise ValueError(f"env key {key!r} is not a valid variable name")
        if key.upper().startswith(RESERVED_ENV_PREFIX):
            raise ValueError(f"env key {key!r} uses the reserved prefix {RESERVED_ENV_PREFIX}")
        if not isinstance(val, str | int | float | bool):
            raise ValueError(f"env value of {key!r} must be a string")
        env[key] = str(val)
    return env


TENANT_PLACEHOLDER = "{tenant}"


def allow_list_entry_error(entry: str) -> str | None:
    """Why `entry` is not a volume allow-list entry, or None. An entry is `/prefix` (every
    tenant), `/prefix/{tenant}` (each tenant's own: the placeholder is the tenant's id) or
    `<tenant>=/prefix` (that tenant only)."""
    scope, _, prefix = ("", "", entry) if entry.startswith("/") else entry.partition("=")
    if not prefix.startswith("/"):
        return f"{entry!r} is neither /prefix nor <tenant>=/prefix"
    if scope and (scope != scope.strip() or "/" in scope or "{" in scope):
        return f"{entry!r}: the tenant before '=' is not a tenant id"
    if "\x00" in prefix or ".." in prefix.split("/"):
        return f"{entry!r}: no NUL or '..' segment in a prefix"
    if "{" in prefix.replace(TENANT_PLACEHOLDER, "") or "}" in prefix.replace(
        TENANT_PLACEHOLDER, ""
    ):
        return f"{entry!r}: {TENANT_PLACEHOLDER} is the only placeholder"
    return None


def tenant_allow_list(allow_list: Iterable[str], tenant_id: str) -> list[str]:
    """The concrete prefixes `tenant_id` may mount: plain entries, its own `<tenant>=`
    entries, and `{tenant}` entries with its id in place. A placeholder or scoped entry gives
    nothing for an empty (or path-like) tenant id; malformed entries give nothing."""
    usable = bool(tenant_id) and "/" not in tenant_id and tenant_id not in (".", "..")
    out: list[str] = []
    for entry in allow_list:
        if allow_list_entry_error(entry):
            continue
        scope, _, prefix = ("", "", entry) if entry.startswith("/") else entry.partition("=")
        if scope and scope != tenant_id:
            continue
        if TENANT_PLACEHOLDER in prefix:
            if not usable:
                continue
            prefix = prefix.replace(TENANT_PLACEHOLDER, tenant_id)
        if prefix not in out:
            out.append(prefix)
    return out


def host_path_allowed(host_path: str, allow_list: Iterable[str]) -> bool:
    """True when the normalised absolute path lies under one of the allowed prefixes.

    `allow_list` holds concrete prefixes (`tenant_allow_list` of the task's tenant); an entry
    still scoped or holding the placeholder allows nothing. The text alone: the agent
    resolves the path on its host again (agent/recheck.py)."""
    if not host_path.startswith("/") or "\x00" in host_path:
        return False
    if ".." in host_path.split("/"):
        return False
    norm = posixpath.normpath(host_path)
    for prefix in allow_list:
        if not prefix.startswith("/") or TENANT_PLACEHOLDER in prefix:
            continue
        p = posixpath.normpath(prefix)
        if norm == p or norm.startswith(p.rstrip("/") + "/"):
            return True
    return False


def _field_of(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(x) for x in loc) if loc else "body"


def _check_keys(raw: Mapping[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(k for k in raw if k not in allowed and k not in SERVER_OWNED)
    if unknown:
        raise DomainError(Code.UNKNOWN_FIELD, f"unknown field(s): {', '.join(unknown)}", unknown)
    owned = sorted(k for k in raw if k in SERVER_OWNED and not _is_zero(raw[k]))
    if owned:
        raise DomainError(
            Code.SERVER_OWNED_FIELD,
            f"server-owned field(s) cannot be set: {', '.join(owned)}",
            owned,
        )


def _validation_error(exc: ValidationError) -> DomainError:
    """Unknown names first, at any depth (`volumes.0.mode`: 40001, as a top-level one),
    else every bad value (40003)."""
    unknown = sorted(
        {_field_of(tuple(e["loc"])) for e in exc.errors() if e["type"] == "extra_forbidden"}
    )
    if unknown:
        return DomainError(Code.UNKNOWN_FIELD, f"unknown field(s): {', '.join(unknown)}", unknown)
    fields: list[str] = []
    parts: list[str] = []
    for err in exc.errors():
        name = _field_of(tuple(err["loc"]))
        if name not in fields:
            fields.append(name)
        msg = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{name}: {msg}")
    return DomainError(Code.INVALID_VALUE, "invalid value: " + "; ".join(parts), fields)


def _check_semantics(spec: TaskSpec, *, tenant: bool, volume_allow_list: Iterable[str]) -> None:
    if spec.gpu_required > 0 and spec.is_fractional:
        fields = ["gpu_required"] + [
            f for f in ("gpu_memory_mb", "gpu_compute_ratio") if getattr(spec, f)
        ]
        raise DomainError(
            Code.INVALID_VALUE,
            "gpu_required (whole cards) and gpu_memory_mb/gpu_compute_ratio (a fraction) "
            "are mutually exclusive",
            fields,
        )
    if spec.priority >= SYSTEM_PRIORITY:
        raise DomainError(
            Code.INVALID_VALUE,
            f"priority {SYSTEM_PRIORITY} is reserved for system recovery",
            ["priority"],
        )
    if tenant and spec.priority > TENANT_MAX_PRIORITY:
        raise DomainError(
            Code.INVALID_VALUE,
            f"priority {spec.priority} is above {TENANT_MAX_PRIORITY}, the most a tenant may set",
            ["priority"],
        )
    check_host_paths([vol.host_path for vol in spec.volumes], volume_allow_list)


def check_host_paths(host_paths: Iterable[object], volume_allow_list: Iterable[str]) -> None:
    """400 naming `volumes.<i>.host_path` for the first path outside the (tenant's) list;
    a non-string is left to the model's validation."""
    allow = list(volume_allow_list)
    for i, host_path in enumerate(host_paths):
        if isinstance(host_path, str) and not host_path_allowed(host_path, allow):
            raise DomainError(
                Code.INVALID_VALUE,
                f"volumes[{i}].host_path {host_path!r} is not under an allowed prefix "
                f"({', '.join(allow) or 'none configured'})",
                [f"volumes.{i}.host_path"],
            )


def parse_create(
    raw: Any,
    *,
    tenant: bool,
    volume_allow_list: Iterable[str] = (),
    defaults: Mapping[str, Any] | None = None,
) -> TaskSpec:
    """Validate a create-task body into a TaskSpec or raise DomainError (SPEC §2).

    `defaults`: configured values of `CONFIGURED_DEFAULTS` fields for a body that leaves them
    out (the gateway's settings); they are written into the spec, so every later reader of
    the task (retry engine, transition whitelist, history checker) sees one value.
    """
    if not isinstance(raw, Mapping):
        raise DomainError(Code.INVALID_VALUE, "request body must be a JSON object", ["body"])
    _check_keys(raw, CREATE_FIELDS)
    data = dict(defaults or {}) | {k: v for k, v in raw.items() if k not in SERVER_OWNED}
    assert not (data.keys() - raw.keys()) - CONFIGURED_DEFAULTS, "only configured defaults"
    for key in ("gpu_required", "gpu_count"):
        # Before the alias is folded (false == 0 in Python: the two would "agree").
        if key in data and not is_integer(data[key]):
            raise DomainError(Code.INVALID_VALUE, f"{key} must be an integer", [key])
    if "gpu_count" in data:
        if "gpu_required" in data and data["gpu_required"] != data["gpu_count"]:
            raise DomainError(
                Code.INVALID_VALUE,
                "gpu_count is an alias of gpu_required; they disagree",
                ["gpu_count", "gpu_required"],
            )
        data["gpu_required"] = data.pop("gpu_count")
    for key, value in data.items():
        if value is None and key not in NULLABLE:
            raise DomainError(Code.INVALID_VALUE, f"{key} must not be null", [key])
    if data.get("image", "") is None:
        del data["image"]
    try:
        spec = TaskSpec.model_validate(data, strict=False)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    _check_strict_types(data)
    spec = check_task_spec(spec)
    _check_semantics(spec, tenant=tenant, volume_allow_list=volume_allow_list)
    return boosted(spec)


def boosted(spec: TaskSpec) -> TaskSpec:
    """The spec with the inference memory boost applied (libs/domain/task/boost.py).

    At creation, not at start: the scheduler places by this spec, so it counts the memory the
    container will get. An update goes through `parse_create` again, so it is applied there too.
    """
    memory, _ = boost_memory(spec.image, spec.memory_mb, spec.uses_gpu)
    return spec if memory == spec.memory_mb else spec.model_copy(update={"memory_mb": memory})


def boost_line(raw: Mapping[str, Any], spec: TaskSpec) -> str | None:
    """The log line of the boost `parse_create(raw)` applied to give `spec`, or None."""
    asked = raw.get("memory_mb")
    memory = DEFAULT_MEMORY_MB if asked is None else int(asked)
    return boost_memory(spec.image, memory, spec.uses_gpu)[1]


def _check_strict_types(data: Mapping[str, Any]) -> None:
    """Lax validation turns "3" into 3; a wrongly typed value is a client bug we name."""
    ints = {"gpu_required", "gpu_memory_mb", "memory_mb", "priority", "timeout", "max_retries"}
    ints |= {"idle_timeout_minutes", "oom_memory_limit"}
    for key in ints & data.keys():
        v = data[key]
        if v is None and key in NULLABLE:
            continue
        if not is_integer(v):
            raise DomainError(Code.INVALID_VALUE, f"{key} must be an integer", [key])
    numbers = {"cpu_cores", "gpu_compute_ratio", "retry_delay", "backoff_multiplier"}
    for key in numbers & data.keys():
        v = data[key]
        if v is None and key in NULLABLE:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise DomainError(Code.INVALID_VALUE, f"{key} must be a number", [key])
    for key in {"name", "image", "command", "gpu_type", "requested_node_id"} & data.keys():
        if not isinstance(data[key], str):
            raise DomainError(Code.INVALID_VALUE, f"{key} must be a string", [key])
    if "preemptible" in data and not isinstance(data["preemptible"], bool):
        raise DomainError(Code.INVALID_VALUE, "preemptible must be a boolean", ["preemptible"])


def parse_update(
    current: Task,
    raw: Any,
    *,
    tenant: bool,
    volume_allow_list: Iterable[str] = (),
) -> tuple[TaskSpec, dict[str, Any]]:
    """Validate a tenant config update; return the new spec and the changed fields.

    Report fields are not handled here: the gateway routes them to the report path (agents,
    operators) or refuses them with 403 (tenants) before calling this.
    """
    if not isinstance(raw, Mapping) or not raw:
        raise DomainError(Code.INVALID_VALUE, "request body must be a non-empty JSON object")
    _check_keys(raw, CREATE_FIELDS)
    data = dict(raw)
    # The alias is folded by parse_create, which checks both names' types and agreement.
    named = set(data) - {"gpu_count"} | ({"gpu_required"} if "gpu_count" in data else set())
    late = sorted(named - ANYTIME_FIELDS)
    if late and current.status is not TaskStatus.PENDING:
        raise DomainError(
            Code.NOT_PENDING,
            f"cannot update {', '.join(late)} of a task that is not pending "
            f"(status: {current.status.value})",
            late,
        )
    merged = current.spec.model_dump(exclude={"platform"})
    if named & {"gpu_required"}:
        del merged["gpu_required"]
    merged |= data
    spec = parse_create(merged, tenant=tenant, volume_allow_list=volume_allow_list)
    spec = spec.model_copy(update={"platform": current.spec.platform})
    # memory_mb may change without being named: the boost follows a new image (`boosted`).
    boost = {"memory_mb"} if spec.memory_mb != current.spec.memory_mb else set()
    changes = {k: v for k, v in spec.model_dump(mode="json").items() if k in named or k in boost}
    return spec, changes
