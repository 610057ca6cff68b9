"""The request contract: every request body and query string of the API as a pydantic model.

Each model serves twice. A route declares `Depends(query_of(M))` or `Depends(body_of(M))`;
the dependency checks the request against `M`, and `contract.complete` finds the same
dependency on the route and writes `M`'s JSON schema into the operation's OpenAPI entry. So
the document and the code cannot differ: what a route checks is what it documents.

Refusals keep SPEC §2's codes: an undeclared field or parameter is 40001 naming each one, a
value outside the schema 40003 naming the field and saying what it must be (the words come
from the same schema). Bodies the domain parses itself (a task, a group, a pool, …) are
documented from the domain's own model (`documented_body`), which that parser validates
against.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Annotated, Any, Literal, TypeVar

from fastapi import Request
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from libs.config import GatewaySettings
from libs.domain.errors import Code, DomainError
from libs.domain.group.autoscale import AutoScale
from libs.domain.group.model import GroupStatus
from libs.domain.group.windows import ScheduleWindow
from libs.domain.task.states import TaskStatus
from libs.domain.validation import INT_FIELD_MAX, exactly_int

from .limits import read_json_object

M = TypeVar("M", bound=BaseModel)
B = TypeVar("B", bound="BodyModel")
# A schema may depend on the gateway's settings (the volume allow-list).
DocSchema = Callable[[GatewaySettings], dict[str, Any]]
REF_TEMPLATE = "#/components/schemas/{model}"

# A non-blank string of at most 100 characters (names, ids, subjects).
Name = Annotated[str, Field(min_length=1, max_length=100, pattern=r"\S")]

# JSON integers, `3.0` included (JSON Schema's integer), never `true` or `"3"`; the bounds
# come before the validator so that the document shows them.
_exact = BeforeValidator(exactly_int)
Quota = Annotated[int, Field(ge=0, le=1_000_000), _exact]
TokenTtl = Annotated[int, Field(ge=60, le=30 * 86_400), _exact]
Minutes = Annotated[int, Field(ge=0, le=INT_FIELD_MAX), _exact]
Replicas = Annotated[int, Field(ge=0, le=1024), _exact]


class Contract:
    """What a checking dependency documents: where (`query` or `body`) and which schema."""

    def __init__(self, where: Literal["query", "body"], schema: DocSchema) -> None:
        self.where = where
        self.schema = schema


# --- query strings -----------------------------------------------------------------------


class QueryModel(BaseModel):
    """A query string: values arrive as text, so numbers are parsed (lax), nothing else is."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _lower(v: Any) -> Any:
    return v.lower() if isinstance(v, str) else v


# Seed 002's status names, accepted in any case as `gpu_count` is beside `gpu_required`: its
# SUCCESS is our `completed`; the others (PENDING, RUNNING, STOPPED, ...) are ours.
V2_STATUS = {"success": "completed"}


def _status_name(v: Any) -> Any:
    v = _lower(v)
    return V2_STATUS.get(v, v) if isinstance(v, str) else v


class _ListQuery(QueryModel):
    """What the task and group lists share: pages, name, labels, order, and the status
    (typed by each list) read case-insensitively with seed 002's names."""

    page: int = Field(default=1, ge=1, le=1_000_000)
    per_page: int = Field(default=20, ge=1, le=500)
    name: str = ""
    sort: Literal["created_at", "updated_at", "priority"] = "created_at"
    order: Literal["asc", "desc"] = "desc"
    labels: str = Field(
        default="",
        pattern=r"^([^=,]+=[^,]*(,[^=,]+=[^,]*)*)?$",
        description="k=v[,k=v...]: only those carrying every one of these labels",
    )

    _lowered = field_validator("order", mode="before")(_lower)
    _status = field_validator("status", mode="before", check_fields=False)(_status_name)

    def filters(self) -> dict[str, Any]:
        """The store query's fields both lists share (labels already checked by `pattern`)."""
        status = getattr(self, "status", None)
        pairs = (p.partition("=") for p in self.labels.split(",") if p)
        return {
            "page": self.page,
            "per_page": self.per_page,
            "status": status.value if status else None,
            "name": self.name or None,
            "labels": {k: v for k, _, v in pairs},
            "sort": self.sort,
            "order": self.order,
        }


STATUS_NOTE = "case-insensitive; seed 002's SUCCESS means completed"


class TaskListQuery(_ListQuery):
    status: TaskStatus | None = Field(default=None, description=STATUS_NOTE)
    node_id: str = ""


class GroupListQuery(_ListQuery):
    """The group list: the task list's filters but `node_id`, over group statuses."""

    status: GroupStatus | None = Field(default=None, description=STATUS_NOTE)


class PageQuery(QueryModel):
    """Lists of groups and jobs."""

    page: int = Field(default=1, ge=1, le=1_000_000)
    per_page: int = Field(default=20, ge=1, le=500)
    status: str = ""


class TimelineQuery(QueryModel):
    page: int = Field(default=1, ge=1, le=1_000_000)
    per_page: int = Field(default=50, ge=1, le=200)


class LogsQuery(QueryModel):
    lines: int = Field(default=100, ge=1, le=100_000)
    follow: bool = Field(default=False, description="true: Server-Sent Events until the end")

    @field_validator("follow", mode="before")
    @classmethod
    def _bool(cls, v: Any) -> Any:
        # Only these four spellings (pydantic would also take yes/no/on/off).
        if isinstance(v, str) and v.lower() in ("true", "false", "1", "0"):
            return v.lower() in ("true", "1")
        if isinstance(v, bool):
            return v
        raise ValueError("must be true or false")


_NUMBER = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*")


def _iso_time(v: Any) -> Any:
    """A time in a query is ISO 8601, as the document says (`format: date-time`): pydantic
    would read a bare number as Unix seconds, which the document does not declare."""
    if isinstance(v, str) and _NUMBER.fullmatch(v):
        raise ValueError(f"an ISO 8601 time is expected, not the number {v!r}")
    return v


IsoTime = Annotated[datetime, BeforeValidator(_iso_time)]


class GpuMetricsQuery(QueryModel):
    start: IsoTime | None = Field(default=None, description="default: an hour before end")
    end: IsoTime | None = Field(default=None, description="default: now")
    step: int = Field(default=60, ge=1, le=86_400, description="seconds per point")


class CreateQuery(QueryModel):
    tenant_id: str = Field(
        default="", max_length=100, description="operators only: the tenant to create for"
    )


class JoinTokenQuery(QueryModel):
    ttl_s: int = Field(default=3600, ge=1, le=7 * 24 * 3600)


# --- bodies checked here -----------------------------------------------------------------


class BodyModel(BaseModel):
    """A JSON body: types are exact (no "3" for 3, no true for 1), nothing undeclared."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class TenantCreate(BodyModel):
    id: Name
    name: Name | None = Field(default=None, description="default: the id")
    gpu_quota: Quota = 0


class TenantUpdate(BodyModel):
    suspended: bool | None = None
    # The bounds inside the optional type, where the document shows them.
    gpu_quota: Quota | None = None


class ApiKeyCreate(BodyModel):
    name: Name = "api-key"


class TokenCreate(BodyModel):
    subject: Name
    ttl_seconds: TokenTtl = 3600


class GroupUpdate(BodyModel):
    """What a task group takes as an update (anything else: 400/40020, by the route);
    `null` removes `auto_scale` or `schedule_window` (docs/autoscaling.md)."""

    idle_timeout_minutes: Minutes | None = None
    auto_scale: AutoScale | None = None
    schedule_window: ScheduleWindow | None = None


class ScaleRequest(BodyModel):
    replicas: Replicas


# --- checking ------------------------------------------------------------------------------


def query_of(model: type[M]) -> Callable[[Request], Awaitable[M]]:
    """A dependency: the request's query string checked against `model` (async though it
    awaits nothing: FastAPI runs a plain `def` dependency in a worker thread, a hand-off per
    request; tests/unit/test_gateway_async_deps.py)."""

    async def check(request: Request) -> M:
        return validate(model, dict(request.query_params), "query parameter")

    check.contract = Contract("query", lambda _: model_schema(model))  # type: ignore[attr-defined]
    return check


def body_of(model: type[B]) -> Callable[[Request], Awaitable[B]]:
    """A dependency: the JSON object body checked against `model`, as a `model`."""

    async def check(request: Request) -> B:
        return validate(model, await read_json_object(request), "field")

    check.contract = Contract("body", lambda _: model_schema(model))  # type: ignore[attr-defined]
    return check


def documented_body(schema: DocSchema) -> Callable[..., Any]:
    """A dependency: the JSON object body, checked by the route's domain parser against the
    model whose schema `schema` gives (the parser names its own refusals)."""

    async def read(request: Request) -> dict[str, Any]:
        return await read_json_object(request)

    read.contract = Contract("body", schema)  # type: ignore[attr-defined]
    return read


def validate(model: type[M], data: dict[str, Any], what: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise refusal(model, exc, what) from None


def refusal(model: type[BaseModel], exc: ValidationError, what: str) -> DomainError:
    """Undeclared names first (40001, each named), else every bad value (40003)."""
    errors = exc.errors()
    unknown = sorted({_loc(e["loc"]) for e in errors if e["type"] == "extra_forbidden"})
    if unknown:
        return DomainError(Code.UNKNOWN_FIELD, f"unknown {what}(s): {', '.join(unknown)}", unknown)
    schema = model_schema(model)
    props, defs = schema.get("properties", {}), schema.get("$defs", {})
    fields: list[str] = []
    parts: list[str] = []
    for err in errors:
        name = _loc(err["loc"])
        if name in fields:
            continue
        fields.append(name)
        top = str(err["loc"][0]) if err["loc"] else ""
        if err["type"] == "missing":
            parts.append(f"{name} is required")
        else:
            got = err.get("input")
            shown = (
                f" (got {got!r})"
                if isinstance(got, str | int | float) and len(repr(got)) <= 80
                else ""
            )
            parts.append(f"{name} {must_be(props.get(top, {}), defs)}{shown}")
    return DomainError(Code.INVALID_VALUE, "; ".join(parts), fields)


def _loc(loc: Iterable[int | str]) -> str:
    return ".".join(str(p) for p in loc) or "body"


def must_be(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> str:
    """What a value must be, in words, from its JSON schema (`defs`: where `$ref`s point)."""
    options = [s for s in schema.get("anyOf", [schema]) if s.get("type") != "null"]
    s = options[0] if options else schema
    if "$ref" in s:
        s = (defs or {}).get(s["$ref"].rsplit("/", 1)[-1], {})
    if "enum" in s:
        return "must be one of " + ", ".join(str(v) for v in s["enum"])
    kind = s.get("type")
    if kind in ("integer", "number"):
        noun = "an integer" if kind == "integer" else "a number"
        lo, hi = s.get("minimum"), s.get("maximum")
        if lo is not None and hi is not None:
            return f"must be {noun} in {lo}..{hi}"
        if lo is not None:
            return f"must be {noun} >= {lo}"
        return f"must be {noun}" + (f" <= {hi}" if hi is not None else "")
    if kind == "boolean":
        return "must be true or false"
    if kind == "string":
        lo, hi = s.get("minLength", 0), s.get("maxLength")
        size = f" of {lo}-{hi} chars" if hi is not None else ""
        shape = " matching " + s["pattern"] if s.get("pattern") not in (None, r"\S") else ""
        blank = ", not blank" if s.get("pattern") == r"\S" else ""
        return f"must be a string{size}{blank}{shape}"
    return "is not valid"


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """`model`'s JSON schema with references into components/schemas (`$defs` kept aside for
    the document to hoist)."""
    return model.model_json_schema(ref_template=REF_TEMPLATE)
