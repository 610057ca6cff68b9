"""The documented shape of the bodies the domain parses itself: a task, a task update, a group,
a job, a rollout, a pool, a queue.

Each schema starts from the domain model its parser validates against (`TaskSpec`,
`GroupShape`, `JobSpec`, …) and adds what the parser checks beyond the model, from the same
constants and settings the checks use: the OCI image grammar, the per-field limits of
`libs.domain.validation`, the volume allow-list, the forbidden mount points, the reserved env
prefix, the most a tenant may set as priority. A client that follows the schema is accepted
(state- and reference-dependent refusals aside: a named queue must exist, `sleep` needs a
running task); one that does not is refused with the field named.
"""

from __future__ import annotations

import re
from typing import Any
from zoneinfo import available_timezones

from pydantic import BaseModel

from libs.config import GatewaySettings
from libs.domain import validation as v
from libs.domain.group.model import GroupShape, Parallelism
from libs.domain.group.serving import _PATH as SERVING_PATH
from libs.domain.group.windows import DAYS, ScheduleWindow
from libs.domain.job.spec import KEY_PATTERN, MAX_TASKS, JobSpec
from libs.domain.pool.model import PoolSpec, QueueSpec
from libs.domain.rollout.model import RolloutRequest
from libs.domain.task.model import (
    NAME_MAX,
    REPORT_FIELDS,
    RESERVED_ENV_PREFIX,
    TENANT_MAX_PRIORITY,
    TENANT_PLACEHOLDER,
    TaskSpec,
)
from libs.domain.task.states import TaskStatus

from .schemas import model_schema

# Some character Python does not strip (`\s` of JSON schema lacks \x1c-\x1f and \x85).
NOT_BLANK = r"[^\s\x1c-\x1f\x85]"
# One path segment with a name: not empty, not `.`, not `..`.
_NAME = r"(?:[^/.\x00][^/\x00]*|\.[^/.\x00][^/\x00]*|\.\.[^/\x00]+)"
# Any segment but `..` (normpath drops `.` and empty ones).
_SEGMENT = rf"(?:{_NAME}|\.)?"
_NO_NUL = r"^[^\x00]*$"
TENANT_ID_PATTERN = r"[a-z0-9][a-z0-9-]{0,62}"  # libs/auth.py TENANT_ID_RE


def image_pattern() -> str:
    """The OCI reference grammar of `validation.IMAGE_REFERENCE` as a JSON-schema pattern
    (no named groups; ASCII word characters), or "" for no image."""
    # `\w` occurs only inside character classes there (the tag): ASCII word characters.
    pattern = re.sub(r"\(\?P<\w+>", "(", v.IMAGE_REFERENCE.pattern).replace(r"\w", "A-Za-z0-9_")
    return f"^(?:{pattern})?$"


def _prefix_pattern(entry: str) -> str:
    """One allow-list entry: `<tenant>=` dropped, `{tenant}` any tenant id (the document is
    the same for every caller; the server refuses another tenant's directory, 400)."""
    prefix = entry if entry.startswith("/") else entry.partition("=")[2]
    parts = [re.escape(part) for part in prefix.rstrip("/").split(TENANT_PLACEHOLDER)]
    return TENANT_ID_PATTERN.join(parts)


def host_path_pattern(allow_list: list[str]) -> str:
    """Absolute, under one of the allowed prefixes, no `..` segment."""
    prefixes = "|".join(_prefix_pattern(p) for p in allow_list) or "(?!)"
    return rf"^(?:{prefixes})(?:/{_SEGMENT})*$"


def container_path_pattern() -> str:
    """Absolute, no `..` segment, and once `.` and empty segments are dropped (normpath) at
    least one segment, the first not one of the forbidden mounts."""
    forbidden = "|".join(re.escape(p.lstrip("/")) for p in v.FORBIDDEN_MOUNTS)
    return rf"^(?:/\.?)*/(?!(?:{forbidden})(?:/|$)){_NAME}(?:/(?:{_NAME}|\.)?)*$"


def env_key_pattern() -> str:
    prefix = RESERVED_ENV_PREFIX
    reserved = "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in prefix)
    return rf"^(?!{reserved})[^=\x00]+$"


def label_key_pattern() -> str:
    """Not empty, no NUL, not in the platform's namespace (`heteroflow.`, any case)."""
    reserved = "".join(
        f"[{c.upper()}{c.lower()}]" if c.isalpha() else re.escape(c)
        for c in v.RESERVED_LABEL_PREFIX
    )
    return rf"^(?!{reserved})[^\x00]+$"


def _string_map(entries: int, key_max: int, value_max: int, key_pattern: str) -> dict[str, Any]:
    return {
        "type": "object",
        "maxProperties": entries,
        "propertyNames": {"minLength": 1, "maxLength": key_max, "pattern": key_pattern},
        "additionalProperties": {"type": "string", "maxLength": value_max},
    }


def _env() -> dict[str, Any]:
    as_map = _string_map(v.ENV_MAX_ENTRIES, v.ENV_KEY_MAX, v.ENV_VALUE_MAX, env_key_pattern())
    # V2 clients send numbers and booleans as values too: they are taken as their text.
    as_map["additionalProperties"] = {
        "anyOf": [{"type": "string", "maxLength": v.ENV_VALUE_MAX}, {"type": ["number", "boolean"]}]
    }
    reserved = env_key_pattern().removesuffix(r"[^=\x00]+$")
    as_list = {
        "type": "array",
        "maxItems": v.ENV_MAX_ENTRIES,
        "items": {"type": "string", "pattern": rf"{reserved}[^=\x00]+=[^\x00]*$"},
    }
    return {
        "anyOf": [as_map, as_list],
        "description": f"KEY=VALUE list or a map; keys starting {RESERVED_ENV_PREFIX} are refused",
    }


def _variant_fields(variant: dict[str, Any], image: dict[str, Any]) -> None:
    """A variant's fields under the limits of the task's own (libs/domain/validation.py:
    check_variants); docs/scheduling.md#variants."""
    props = variant["properties"]
    for prop in props.values():
        prop.pop("title", None)
    props["image"] = {
        "anyOf": [image["anyOf"][0], {"const": ""}],
        "default": "",
        "description": "empty: the task's image",
    }
    props["command"] |= {"maxLength": v.COMMAND_MAX, "description": "empty: the task's command"}
    props["gpu_type"]["maxLength"] = v.SHORT_TEXT_MAX
    _bound(props["gpu_memory_mb"], v.INT_FIELD_MAX)
    props["env"] = _env() | {"description": "laid over the task's env"}
    props["wait_s"]["description"] = (
        "seconds after submission that this variant and every earlier one are waited for "
        "before the next is considered too; the last variant's is not read"
    )


def task_fields(settings: GatewaySettings, *, tenant_priority: bool = True) -> dict[str, Any]:
    """`TaskSpec`'s schema, with the parser's further rules (see the module docstring)."""
    schema = model_schema(TaskSpec)
    props = schema["properties"]
    # Server-owned (set only where the platform builds a spec; sent non-empty: 40002).
    props.pop("platform")
    schema["$defs"].pop("Platform")
    for prop in props.values():
        prop.pop("title", None)
    props["name"] |= {"pattern": NOT_BLANK, "maxLength": NAME_MAX}
    # null, like an omitted image: a plain process (NULLABLE in libs/domain/task/model.py).
    props["image"] = {
        "anyOf": [
            {"type": "string", "pattern": image_pattern(), "maxLength": v.IMAGE_NAME_MAX},
            {"type": "null"},
        ],
        "default": "",
        "description": f"an OCI reference; its repository name at most {v.IMAGE_NAME_MAX} "
        f"characters (the server takes up to {v.IMAGE_MAX} with a tag or digest)",
    }
    for field in v.UNBOUNDED_INTS:
        _bound(props[field], v.INT_FIELD_MAX)
    props["command"]["maxLength"] = v.COMMAND_MAX
    for field in ("gpu_type", "requested_node_id"):
        props[field]["maxLength"] = v.SHORT_TEXT_MAX
    props["priority"] |= {
        "maximum": TENANT_MAX_PRIORITY if tenant_priority else 99,
        "description": f"tenants 0..{TENANT_MAX_PRIORITY}; operators up to 99 (100 is reserved)",
    }
    props["env"] = _env()
    props["labels"] = _string_map(
        v.LABELS_MAX_ENTRIES, v.LABEL_KEY_MAX, v.LABEL_VALUE_MAX, label_key_pattern()
    )
    props["labels"]["description"] = (
        f"keys starting {v.RESERVED_LABEL_PREFIX} (any case) are the platform's: refused, 40002"
    )
    short = {
        "type": "string",
        "maxLength": v.SHORT_TEXT_MAX,
        "pattern": label_key_pattern().replace("+$", "*$"),
    }
    props["anti_affinity"] = {
        "anyOf": [short, {"type": "array", "maxItems": v.ANTI_AFFINITY_MAX, "items": short}]
    }
    props["volumes"] |= {"maxItems": v.VOLUMES_MAX}
    props["gpu_count"] = props["gpu_required"] | {
        "description": "V2 alias of gpu_required (send one of the two)"
    }
    volume = schema["$defs"]["Volume"]["properties"]
    volume["host_path"] |= {
        "maxLength": v.PATH_MAX,
        "pattern": host_path_pattern(settings.volume_allow_list),
        "description": "under one of " + ", ".join(settings.volume_allow_list),
    }
    volume["container_path"] |= {"maxLength": v.PATH_MAX, "pattern": container_path_pattern()}
    _variant_fields(schema["$defs"]["TaskVariant"], props["image"])
    # The serving paths: empty, or an absolute URL path (libs/domain/group/serving.py).
    url_path = {"pattern": f"^(?:{SERVING_PATH.pattern.strip('^$')})?$"}
    for field in ("health_path", "metrics_path"):
        schema["$defs"]["ServingSpec"]["properties"][field] |= url_path
    # A fraction (gpu_memory_mb / gpu_compute_ratio) excludes whole cards (either name of
    # them); the alias and its field are not sent together (the server takes them when
    # they agree).
    fraction = {
        "anyOf": [
            {"required": ["gpu_memory_mb"], "properties": {"gpu_memory_mb": {"minimum": 1}}},
            {
                "required": ["gpu_compute_ratio"],
                "properties": {"gpu_compute_ratio": {"exclusiveMinimum": 0}},
            },
        ],
    }
    cards = {
        "anyOf": [
            {"required": [f], "properties": {f: {"minimum": 1}}}
            for f in ("gpu_required", "gpu_count")
        ]
    }
    # With variants the cards are named in each variant only (validation.check_variants).
    named = {"required": ["gpu_type"], "properties": {"gpu_type": {"minLength": 1}}}
    with_variants = {"required": ["variants"], "properties": {"variants": {"minItems": 1}}}
    schema["not"] = {
        "anyOf": [
            {"required": ["gpu_count", "gpu_required"]},
            {"allOf": [cards, fraction]},
            {"allOf": [with_variants, {"anyOf": [cards, fraction, named]}]},
        ]
    }
    variant_cards = {"required": ["gpu_required"], "properties": {"gpu_required": {"minimum": 1}}}
    schema["$defs"]["TaskVariant"]["not"] = {"allOf": [variant_cards, fraction]}
    return no_nul(schema)


def no_nul(schema: dict[str, Any]) -> dict[str, Any]:
    """Every string of `schema` (nested ones too) without NUL, which the server refuses in
    any string of a body (`validation.check_json_document`)."""
    _no_nul(schema)
    return schema


def _no_nul(schema: Any) -> None:
    if isinstance(schema, list):
        for item in schema:
            _no_nul(item)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if (kind == "string" or (isinstance(kind, list) and "string" in kind)) and not (
            "enum" in schema or "const" in schema or "\\x00" in schema.get("pattern", "")
        ):
            if "pattern" in schema:
                schema["allOf"] = [*schema.get("allOf", []), {"pattern": _NO_NUL}]
            else:
                schema["pattern"] = _NO_NUL
        for value in schema.values():
            _no_nul(value)


def _bound(prop: dict[str, Any], maximum: int) -> None:
    for option in prop.get("anyOf", [prop]):
        if option.get("type") == "integer":
            option["maximum"] = maximum


def task_create(settings: GatewaySettings) -> dict[str, Any]:
    return task_fields(settings)


def task_update(settings: GatewaySettings) -> dict[str, Any]:
    """A tenant's config update (any subset of the create fields), or an agent's or
    operator's status report (`status` and the report fields only): the two never mix."""
    config = task_fields(settings)
    config.pop("required", None)
    config.pop("not", None)
    config["minProperties"] = 1
    defs = config.pop("$defs", {})
    text = {"type": "string", "maxLength": v.REPORT_TEXT_MAX}
    statuses = [s.value for s in TaskStatus]
    report: dict[str, Any] = {
        "status": {"enum": statuses, "description": "the new status (agents, operators)"},
        "expected_status": {"enum": ["", *statuses], "description": "compare-and-set on this"},
        "exit_code": {"type": "integer"},
        "result": text,
        "error": text,
        "node_id": {"type": "string"},
        "container_id": {"type": "string"},
        "reason": {"type": "string"},
    }
    assert set(report) >= REPORT_FIELDS - {"finished_at"}
    return {
        "type": "object",
        # Every field either form may carry; `anyOf` says which go together.
        "properties": config["properties"] | report,
        "minProperties": 1,
        "anyOf": [
            config,
            {
                "type": "object",
                "properties": report,
                "required": ["status"],
                "additionalProperties": False,
                "description": "a status report; report fields from a tenant are 403",
            },
        ],
        "description": (
            "config fields while pending (idle_timeout_minutes at any time), or a status report"
        ),
        "$defs": defs,
    }


def _window() -> dict[str, Any]:
    schema = model_schema(ScheduleWindow)
    hhmm = {"type": "string", "pattern": r"^(?:[01][0-9]|2[0-3]):[0-5][0-9]$"}
    schema["properties"]["start"] = hhmm
    schema["properties"]["end"] = hhmm
    schema["properties"]["days"] = {
        "type": "array",
        "minItems": 1,
        "items": {"enum": list(DAYS)},
    }
    # The zones this machine's tz database knows: the ones the window's check accepts.
    schema["properties"]["timezone"] = {"enum": sorted(available_timezones()), "default": "UTC"}
    scale_to = schema["properties"].pop("scale_to")
    scale_to = next(s for s in scale_to["anyOf"] if s.get("type") == "integer")
    schema["oneOf"] = [
        {
            "properties": {"action": {"const": "scale"}, "scale_to": scale_to},
            "required": ["action", "scale_to"],
        },
        {
            "properties": {"action": {"enum": ["pause", "stop"]}, "scale_to": {"type": "null"}},
            "required": ["action"],
        },
    ]
    schema["properties"]["scale_to"] = {"description": "action scale only: the replica count"}
    return schema


def group_create(settings: GatewaySettings) -> dict[str, Any]:
    """A task's fields (the members' template) with the group's shape beside them."""
    schema = task_fields(settings)
    shape = model_schema(GroupShape)
    schema["properties"] |= {
        k: {kk: vv for kk, vv in p.items() if kk != "title"} for k, p in shape["properties"].items()
    }
    schema.setdefault("$defs", {}).update(shape.get("$defs", {}))
    window = _window()
    schema["$defs"].update(window.pop("$defs", {}))
    schema["properties"]["schedule_window"] = {"anyOf": [window, {"type": "null"}]}
    schema["required"] = sorted(set(schema.get("required", [])) | {"task_count"})
    sized = {
        Parallelism.TENSOR_PARALLEL.value: "tensor_parallel_size",
        Parallelism.PIPELINE_PARALLEL.value: "pipeline_parallel_size",
    }
    schema["allOf"] = [
        {
            "if": {"required": ["parallelism"], "properties": {"parallelism": {"const": mode}}},
            "then": {"required": [size], "properties": {size: {"minimum": 2}}},
        }
        for mode, size in sized.items()
    ]
    return schema


def job_create(settings: GatewaySettings) -> dict[str, Any]:
    """`JobSpec`'s schema with each task as the parser takes it (libs/domain/job/spec.py): a
    task create body (no `queue`: a job's tasks run in the job's queue) with `key` and
    `metrics` beside its fields, not a `{key, spec}` pair."""
    schema = model_schema(JobSpec)
    task = task_fields(settings)
    defs = schema["$defs"]
    for name in ("JobNodeSpec", "TaskSpec", "Platform"):
        defs.pop(name, None)
    defs.update(task.pop("$defs", {}))
    task["properties"].pop("queue")
    schema["properties"]["name"] |= {"pattern": NOT_BLANK}
    task["properties"] |= {
        "key": {
            "type": "string",
            "pattern": KEY_PATTERN,
            "description": "unique in the job; dependencies name tasks by it",
        },
        "metrics": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "default": [],
            "description": "the metric names it reports (a condition may read only these)",
        },
    }
    task["required"] = sorted({*task.get("required", []), "key"})
    schema["properties"]["tasks"] = {
        "type": "array",
        "items": task,
        "minItems": 1,
        "maxItems": MAX_TASKS,
    }
    return no_nul(schema)


def rollout(settings: GatewaySettings) -> dict[str, Any]:
    schema = model_schema(RolloutRequest)
    task = task_fields(settings)
    props = schema["properties"]
    props["image"] = {
        "anyOf": [
            {
                "type": "string",
                "pattern": image_pattern(),
                "minLength": 1,
                "maxLength": v.IMAGE_MAX,
            },
            {"type": "null"},
        ]
    }
    props["env"] = task["properties"]["env"]
    props["volumes"] = task["properties"]["volumes"]
    schema.setdefault("$defs", {}).update(task["$defs"])
    schema["anyOf"] = [{"required": [f]} for f in ("image", "env", "volumes", "partition")]
    return schema


def of(model: type[BaseModel]) -> Any:
    return lambda _settings: model_schema(model)


def _fixed_by_path(model: type[BaseModel], *fixed: str) -> Any:
    """An update's body: the whole document again, where the fields the path fixes may be
    left out (sent, they must equal the existing ones, else 400 naming them)."""

    def schema(_settings: GatewaySettings) -> dict[str, Any]:
        doc = model_schema(model)
        doc["required"] = [f for f in doc.get("required", []) if f not in fixed]
        return doc

    return schema


pool = of(PoolSpec)
pool_update = _fixed_by_path(PoolSpec, "name")
queue = of(QueueSpec)
queue_update = _fixed_by_path(QueueSpec, "name", "tenant")
