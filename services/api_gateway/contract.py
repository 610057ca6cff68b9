"""The OpenAPI document as the gateway really answers.

FastAPI documents what it sees in the handlers: the success status, and a 422 that this
gateway never sends (validation failures are 400s in the SPEC §2 error shape). Here the
generated document is completed once, in place:

* the bearer credential every path but the health probes requires (`securitySchemes`);
* every error status an operation can answer is listed with the `Error` schema (401 and 403
  for authenticated paths, 404 and 409 where a path names a resource, 413 and 415 where a
  body is read, 429 for tenants' writes, 503 with `Retry-After` for shedding and a lost
  database, 500 for a bug), and the unused 422 goes;
* every request body and query parameter a route checks through a `schemas` dependency
  (`query_of`, `body_of`, `documented_body`) is described by that dependency's model, so
  what is documented is what is checked;
* schemas embedded whole from pydantic models keep their definitions under `$defs`, which
  no reader of the document can resolve: they move to `components/schemas`, and their
  references with them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from fastapi import routing
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from libs.config import GatewaySettings

from .schemas import Contract

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
    "503": "shed (too much in flight) or the database is unavailable; nothing was changed",
    "500": "internal error",
}
NODE_UNREACHABLE = "internal error (50000), or the node holding the logs did not answer (50002)"
BEARER = {
    "type": "http",
    "scheme": "bearer",
    "description": "operator, agent or tenant API key, tenant-user JWT (a join token for join)",
}
UNAUTHENTICATED = frozenset({"/healthz", "/readyz"})
WRITES = frozenset({"post", "put", "patch", "delete"})
_FASTAPI_VALIDATION = ("HTTPValidationError", "ValidationError")


def complete(
    doc: dict[str, Any], routes: Iterable[BaseRoute] = (), settings: GatewaySettings | None = None
) -> dict[str, Any]:
    """Complete `doc` (FastAPI's generated document for `routes`) in place and return it."""
    schemas: dict[str, Any] = doc.setdefault("components", {}).setdefault("schemas", {})
    _requests(doc, routes, settings or GatewaySettings())
    _hoist_defs(doc, schemas)
    schemas["Error"] = ERROR_SCHEMA
    doc["components"]["securitySchemes"] = {"bearer": BEARER}
    for path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            op["security"] = [] if path in UNAUTHENTICATED else [{"bearer": []}]
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            for status in _errors(path, method):
                described = DESCRIPTIONS[status]
                if status == "500" and path.endswith("/logs"):
                    described = NODE_UNREACHABLE
                answer: dict[str, Any] = {
                    "description": described,
                    "content": {"application/json": {"schema": ERROR_REF}},
                }
                if status in ("429", "503"):
                    answer["headers"] = RETRY_AFTER
                responses.setdefault(status, answer)
    for name in _FASTAPI_VALIDATION:
        schemas.pop(name, None)
    return doc


def _requests(doc: dict[str, Any], routes: Iterable[BaseRoute], settings: GatewaySettings) -> None:
    """Describe each route's query parameters and body from the models it checks them with."""
    for path, methods, dependant in _api_routes(routes):
        for method in methods:
            op = doc.get("paths", {}).get(path, {}).get(method.lower())
            if op is None:
                continue
            for contract in _contracts(dependant):
                schema = contract.schema(settings)
                if contract.where == "body":
                    op["requestBody"] = {
                        "required": True,
                        "content": {"application/json": {"schema": schema}},
                    }
                else:
                    op.setdefault("parameters", []).extend(_query_parameters(schema))


def _api_routes(routes: Iterable[BaseRoute]) -> Iterator[tuple[str, set[str], Dependant]]:
    """(path, methods, dependant) of every API route, through included routers (which newer
    FastAPI keeps as wrappers rather than copying their routes)."""
    iterate = getattr(routing, "iter_route_contexts", None)
    if iterate is None:  # older FastAPI: the routes are the API routes themselves
        contexts: Iterable[Any] = routes
    else:
        contexts = iterate(list(routes))
    for ctx in contexts:
        route = getattr(ctx, "original_route", ctx)
        if isinstance(route, APIRoute) and route.include_in_schema:
            yield ctx.path_format, set(ctx.methods or ()), route.dependant


def _contracts(dependant: Dependant) -> Iterator[Contract]:
    for dep in dependant.dependencies:
        contract = getattr(dep.call, "contract", None)
        if isinstance(contract, Contract):
            yield contract
        yield from _contracts(dep)


def _query_parameters(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """One OpenAPI parameter per property of a query model (null is not a query value)."""
    required = set(schema.get("required", []))
    params = []
    for name, prop in schema.get("properties", {}).items():
        prop = dict(prop)
        options = [s for s in prop.pop("anyOf", []) if s.get("type") != "null"]
        if len(options) == 1:
            prop |= options[0]
        elif options:
            prop["anyOf"] = options
        if prop.get("default", 0) is None:
            del prop["default"]
        prop.pop("title", None)
        param: dict[str, Any] = {"name": name, "in": "query", "required": name in required}
        if "description" in prop:
            param["description"] = prop.pop("description")
        param["schema"] = prop | ({"$defs": schema["$defs"]} if "$defs" in schema else {})
        params.append(param)
    return params


def _errors(path: str, method: str) -> list[str]:
    if path == "/healthz":
        return []
    if path == "/readyz":
        return ["503"]
    statuses = ["400", "401", "403", "500", "503"]
    if "{" in path:
        statuses.append("404")
    if path.endswith("/serving"):  # 40902: the target declares no `serving` port
        statuses.append("409")
    if method in WRITES:
        statuses += ["409", "429"]
    if method in ("post", "put", "patch"):
        statuses += ["413", "415"]
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
