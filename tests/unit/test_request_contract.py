"""The request contract: the OpenAPI document describes every body and query the routes check,
with the same rules the code applies (the patterns are checked against the code's own checks)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.config import GatewaySettings
from libs.domain import validation as v
from libs.domain.errors import Code, DomainError
from libs.domain.task.model import host_path_allowed, normalise_env
from services.api_gateway import request_docs
from services.api_gateway.openapi import document
from services.api_gateway.schemas import (
    ScaleRequest,
    TaskListQuery,
    TenantCreate,
    must_be,
    validate,
)

ALLOW = ["/data", "/mnt/datasets", "/tmp/heteroflow"]
EXAMPLES = settings(max_examples=300, deadline=None)


def _matches(pattern: str, value: str) -> bool:
    return re.search(pattern, value) is not None


@EXAMPLES
@given(st.from_regex(request_docs.image_pattern(), fullmatch=True))
def test_every_image_the_document_allows_is_accepted(ref: str) -> None:
    match = v.IMAGE_REFERENCE.fullmatch(ref)
    if match is None:
        assert not ref
        return
    # The lengths are the schema's maxLength and the one rule it leaves to the check.
    if len(ref) <= v.IMAGE_MAX and len(match["name"]) <= v.IMAGE_NAME_MAX:
        assert v.image_reference_error(ref) is None, ref


@pytest.mark.parametrize(
    ("ref", "ok"),
    [
        ("busybox:latest", True),
        ("registry.local:5000/team/img:v1.2@sha256:" + "a" * 64, True),
        ("", True),
        ("busybox;rm -rf / #", False),
        ("Busybox", False),
        ("img:ä", False),
        ("a b", False),
    ],
)
def test_image_pattern_agrees_with_the_check(ref: str, ok: bool) -> None:
    code_ok = not ref or v.image_reference_error(ref) is None
    assert code_ok is ok and _matches(request_docs.image_pattern(), ref) is ok


@EXAMPLES
@given(st.from_regex(request_docs.container_path_pattern(), fullmatch=True))
def test_every_container_path_the_document_allows_is_accepted(path: str) -> None:
    if len(path) <= v.PATH_MAX and "\x00" not in path:
        v.normalise_container_path(path)


@pytest.mark.parametrize(
    ("path", "ok"),
    [
        ("/models", True),
        ("//models/./x/", True),
        ("/", False),
        ("//", False),
        ("/proc", False),
        ("/proc/1", False),
        ("//sys/", False),
        ("/dev/shm", False),
        ("/a/../b", False),
        ("relative", False),
        ("/procfs", True),
    ],
)
def test_container_path_pattern_agrees_with_the_check(path: str, ok: bool) -> None:
    try:
        v.normalise_container_path(path)
        code_ok = True
    except ValueError:
        code_ok = False
    assert code_ok is ok and _matches(request_docs.container_path_pattern(), path) is ok


@EXAMPLES
@given(st.from_regex(request_docs.host_path_pattern(ALLOW), fullmatch=True))
def test_every_host_path_the_document_allows_is_accepted(path: str) -> None:
    assert "\x00" in path or host_path_allowed(path, ALLOW), path


@pytest.mark.parametrize(
    ("path", "ok"),
    [
        ("/data", True),
        ("/data/models/x", True),
        ("/data/./x", True),
        ("/datax", False),
        ("/data/../etc", False),
        ("/etc", False),
        ("data", False),
    ],
)
def test_host_path_pattern_agrees_with_the_check(path: str, ok: bool) -> None:
    assert host_path_allowed(path, ALLOW) is ok
    assert _matches(request_docs.host_path_pattern(ALLOW), path) is ok


@pytest.mark.parametrize(
    ("key", "ok"),
    [("A", True), ("PATH", True), ("HETEROFLOW_X", False), ("heteroflow_x", False), ("A=B", False)],
)
def test_env_key_pattern_agrees_with_the_check(key: str, ok: bool) -> None:
    try:
        normalise_env({key: "v"})
        code_ok = True
    except ValueError:
        code_ok = False
    assert code_ok is ok and _matches(request_docs.env_key_pattern(), key) is ok


def _doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(document()))
    return doc


BODIES = [
    ("post", "/api/v1/tasks"),
    ("put", "/api/v1/tasks/{task_id}"),
    ("post", "/api/v1/task-groups"),
    ("put", "/api/v1/task-groups/{group_id}"),
    ("post", "/api/v1/task-groups/{group_id}/scale"),
    ("post", "/api/v1/task-groups/{group_id}/rollout"),
    ("post", "/api/v1/jobs"),
    ("post", "/api/v1/pools"),
    ("put", "/api/v1/pools/{name}"),
    ("post", "/api/v1/queues"),
    ("put", "/api/v1/queues/{name}"),
    ("post", "/api/v1/tenants"),
    ("put", "/api/v1/tenants/{tenant_id}"),
    ("post", "/api/v1/tenants/{tenant_id}/api-keys"),
    ("post", "/api/v1/tenants/{tenant_id}/tokens"),
    ("post", "/api/v1/nodes/{node_id}/gpus/{gpu_id}/quarantine"),
    ("post", "/api/v1/tasks/plan"),
    ("post", "/api/v1/task-groups/plan"),
    ("post", "/api/v1/jobs/plan"),
]


@pytest.mark.parametrize(("method", "path"), BODIES, ids=[f"{m} {p}" for m, p in BODIES])
def test_every_body_the_api_reads_has_a_schema(method: str, path: str) -> None:
    body = _doc()["paths"][path][method]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    assert body["required"] and schema["type"] == "object" and schema["properties"]


def test_operations_without_a_documented_body_read_none() -> None:
    """Every POST/PUT that reads a body documents it (the rest take no body)."""
    paths = _doc()["paths"]
    with_body = {
        (m, p) for p, item in paths.items() for m, op in item.items() if "requestBody" in op
    }
    assert with_body == set(BODIES)


def test_query_parameters_come_from_the_route_models() -> None:
    paths = _doc()["paths"]
    listed = {p["name"] for p in paths["/api/v1/tasks"]["get"]["parameters"]}
    assert listed == set(TaskListQuery.model_fields)
    logs = {p["name"]: p for p in paths["/api/v1/tasks/{task_id}/logs"]["get"]["parameters"]}
    assert logs["lines"]["schema"]["maximum"] == 100_000 and logs["follow"]["in"] == "query"
    assert {"page", "per_page", "status"} <= {
        p["name"] for p in paths["/api/v1/jobs"]["get"]["parameters"]
    }


def test_the_task_body_carries_the_allow_list_of_the_settings() -> None:
    doc = request_docs.task_create(GatewaySettings(volume_allow_list=["/srv/in"]))
    host = doc["$defs"]["Volume"]["properties"]["host_path"]["pattern"]
    assert _matches(host, "/srv/in/a") and not _matches(host, "/data/a")


@pytest.mark.parametrize(
    ("model", "body", "code", "message"),
    [
        (ScaleRequest, {}, Code.INVALID_VALUE, "replicas is required"),
        (ScaleRequest, {"replicas": "3"}, Code.INVALID_VALUE, "must be an integer in 0..1024"),
        (ScaleRequest, {"replicas": True}, Code.INVALID_VALUE, "must be an integer in 0..1024"),
        (ScaleRequest, {"replicas": 1, "surge": 1}, Code.UNKNOWN_FIELD, "surge"),
        (TenantCreate, {"id": "  "}, Code.INVALID_VALUE, "id must be a string of 1-100 chars"),
        (
            TenantCreate,
            {"id": "a", "gpu_quota": -1},
            Code.INVALID_VALUE,
            "an integer in 0..1000000",
        ),
    ],
)
def test_refusals_name_the_field_in_the_words_of_the_schema(
    model: Any, body: dict[str, Any], code: Code, message: str
) -> None:
    with pytest.raises(DomainError) as err:
        validate(model, body, "field")
    assert err.value.code == code and message in err.value.message


def test_must_be_reads_the_schema() -> None:
    assert must_be({"type": "boolean"}) == "must be true or false"
    assert must_be({"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]}) == (
        "must be an integer >= 0"
    )
    assert must_be({"enum": ["asc", "desc"]}) == "must be one of asc, desc"
