"""Entry rules: a pool or queue as the API accepts it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from libs.domain.errors import Code, DomainError
from libs.domain.pool.model import PoolSpec, QueueSpec

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
