"""The OpenAPI document as the gateway really answers.

FastAPI documents what it sees in the handlers: the success status, and a 422 that this
gateway never sends (validation failures are 400s in the SPEC §2 error shape). Here the
generated document is completed once, in place:

* every error status an operation can answer is listed with the `Error` schema (401 and 403
  for authenticated paths, 404 and 409 where a path names a resource, 413 and 415 where a
  body is read, 429 for tenants' writes, 503 with `Retry-After` for shedding and a lost
  database, 500 for a bug), and the unused 422 goes;
* schemas embedded whole from pydantic models keep their definitions under `$defs`, which
  no reader of the document can resolve: they move to `components/schemas`, and their
  references with them.
"""

from __future__ import annotations

from typing import Any

ERROR_REF = {"$ref": "#/components/schemas/Error"}
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error", "code"],
    "properties": {
        "error": {"type": "string", "description": "what was wrong, for people"},
        "code": {"type": "integer", "description": "SPEC §2 code (HTTP status × 100 + n)"},
        "fields": {"type": "array", "items": {"type": "string"}, "description": "at fault"},
    },
}
RETRY_AFTER = {
    "Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}
}
DESCRIPTIONS = {
    "400": "invalid request: unknown or server-owned field, bad value, wrong status",
    "401": "missing or unknown credential",
    "403": "the credential may not do this",
    "404": "no such resource (or another tenant's)",
    "409": "the resource moved meanwhile (compare-and-set missed); nothing was changed",
    "413": "request body over the limit",
    "415": "request body not application/json",
    "429": "the tenant is over its write rate",
    "502": "the node holding the task did not answer",
    "503": "shed (too much in flight) or the database is unavailable; nothing was changed",
    "500": "internal error",
}
WRITES = frozenset({"post", "put", "patch", "delete"})
_FASTAPI_VALIDATION = ("HTTPValidationError", "ValidationError")


def complete(doc: dict[str, Any]) -> dict[str, Any]:
    """Complete `doc` (FastAPI's generated document) in place and return it."""
    schemas: dict[str, Any] = doc.setdefault("components", {}).setdefault("schemas", {})
    _hoist_defs(doc, schemas)
    schemas["Error"] = ERROR_SCHEMA
    for path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            for status in _errors(path, method):
                answer: dict[str, Any] = {
                    "description": DESCRIPTIONS[status],
                    "content": {"application/json": {"schema": ERROR_REF}},
                }
                if status in ("429", "503"):
                    answer["headers"] = RETRY_AFTER
                responses.setdefault(status, answer)
    for name in _FASTAPI_VALIDATION:
        schemas.pop(name, None)
    return doc


def _errors(path: str, method: str) -> list[str]:
    if path == "/healthz":
        return []
    if path == "/readyz":
        return ["503"]
    statuses = ["400", "401", "403", "500", "503"]
    if "{" in path:
        statuses.append("404")
    if method in WRITES:
        statuses += ["409", "429"]
    if method in ("post", "put", "patch"):
        statuses += ["413", "415"]
    if path.endswith("/logs"):
        statuses.append("502")
    return sorted(statuses)


def _hoist_defs(node: Any, schemas: dict[str, Any]) -> Any:
    """Move every nested `$defs` into `schemas`; rewrite `#/$defs/X` references."""
    if isinstance(node, dict):
        for name, schema in node.pop("$defs", {}).items():
            schemas.setdefault(name, _hoist_defs(schema, schemas))
        for key, value in list(node.items()):
            if key == "$ref" and isinstance(value, str) and value.startswith("#/$defs/"):
                node[key] = "#/components/schemas/" + value.removeprefix("#/$defs/")
            else:
                node[key] = _hoist_defs(value, schemas)
    elif isinstance(node, list):
        return [_hoist_defs(v, schemas) for v in node]
    return node
