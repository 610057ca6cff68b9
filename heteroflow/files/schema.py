"""The JSON Schema of workload files, generated from the API's documented request bodies
(themselves built from the domain's pydantic models: services/api_gateway/request_docs.py).

Committed as docs/schema/heteroflow-files.json (editors validate files against it); a unit
test fails when it is stale. Regenerate: `just files-schema`
(`python -m heteroflow.files.schema > docs/schema/heteroflow-files.json`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from libs.config import GatewaySettings
from libs.domain.group.autoscale import AutoScale
from services.api_gateway import request_docs
from services.api_gateway.schemas import REF_TEMPLATE, model_schema

from .load import API_VERSION, KINDS

SCHEMA_ID = "https://heteroflow.dev/schema/heteroflow-files.json"
OPENAPI_REFS = REF_TEMPLATE.removesuffix("{model}")


def _group(settings: GatewaySettings) -> dict[str, Any]:
    schema = request_docs.group_create(settings)
    auto = model_schema(AutoScale)
    schema.setdefault("$defs", {}).update(auto.pop("$defs", {}))
    schema["properties"].setdefault("auto_scale", {"anyOf": [auto, {"type": "null"}]})
    return schema


BODIES: dict[str, Callable[[GatewaySettings], dict[str, Any]]] = {
    "Task": request_docs.task_create,
    "TaskGroup": _group,
    "Job": request_docs.job_create,
    "Queue": request_docs.queue,
    "Pool": request_docs.pool,
}


def _refs(value: Any) -> Any:
    """OpenAPI's component references as this document's `$defs` ones."""
    if isinstance(value, dict):
        return {
            k: (
                v.replace(OPENAPI_REFS, "#/$defs/")
                if k == "$ref" and isinstance(v, str)
                else _refs(v)
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_refs(v) for v in value]
    return value


def _spec(body: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """A create body's schema as a file's `spec`: the name lives in `metadata.name`."""
    spec = copy.deepcopy(body)
    defs.update(spec.pop("$defs", {}))
    spec["properties"].pop("name", None)
    spec["required"] = [f for f in spec.get("required", []) if f != "name"]
    if not spec["required"]:
        del spec["required"]
    spec.pop("title", None)
    return spec


def document(settings: GatewaySettings | None = None) -> dict[str, Any]:
    settings = settings or GatewaySettings()
    defs: dict[str, Any] = {}
    specs = {kind: _spec(BODIES[kind](settings), defs) for kind in KINDS}
    for kind, spec in specs.items():
        defs[f"{kind}FileSpec"] = spec
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "HeteroFlow workload file (one document)",
        "description": "heteroflow apply -f; docs/cli.md#files",
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": API_VERSION},
            "kind": {"enum": list(KINDS)},
            "metadata": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name"],
                "properties": {"name": {"type": "string", "minLength": 1}},
            },
            "spec": {"type": "object"},
        },
        "allOf": [
            {
                "if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
                "then": {"properties": {"spec": {"$ref": f"#/$defs/{kind}FileSpec"}}},
            }
            for kind in KINDS
        ],
        "$defs": dict(sorted(defs.items())),
    }
    result: dict[str, Any] = _refs(schema)
    return result


def render() -> str:
    return json.dumps(document(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(render(), end="")
