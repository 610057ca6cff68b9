"""The job schema of the OpenAPI document is what `POST /jobs` takes: bodies generated from
the document the gateway serves (schemathesis' positive generation) are accepted, 201.

References the document cannot express are left out of the generated bodies: `queue` (it
must name an existing queue) and `dependencies` (they name the job's own keys); a job is
one task, so keys are unique, and mounts one volume at most (two container paths that
normalise to one mount point are refused, which a schema cannot say). Everything else
about the task (its fields, `key`, `metrics`) is as generated.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from .helpers import Api

pytestmark = pytest.mark.integration

EXAMPLES = 40


def _job_operation(doc: dict[str, Any]) -> Any:
    doc = copy.deepcopy(doc)
    body = doc["paths"]["/api/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]
    schema = body["schema"]
    if "$ref" in schema:  # the job schema itself, not a reference to it
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
        body["schema"] = schema
    for reference in ("queue", "dependencies"):
        schema["properties"].pop(reference, None)
    schema["additionalProperties"] = False
    schema["properties"]["tasks"]["maxItems"] = 1
    schema["properties"]["tasks"]["items"]["properties"]["volumes"]["maxItems"] = 1
    # Only the operation under test, so loading the document does no more than it needs.
    doc["paths"] = {"/api/v1/jobs": {"post": doc["paths"]["/api/v1/jobs"]["post"]}}
    return schemathesis.openapi.from_dict(doc)["/api/v1/jobs"]["POST"]


def generated_bodies(doc: dict[str, Any]) -> list[Any]:
    operation = _job_operation(doc)
    bodies: list[Any] = []

    @settings(
        max_examples=EXAMPLES,
        database=None,
        derandomize=True,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy())
    def collect(case: Any) -> None:
        bodies.append(case.body)

    collect()
    return bodies


async def test_generated_job_bodies_are_accepted(api: Api) -> None:
    doc = (await api.client.get("/openapi.json")).json()
    task = doc["paths"]["/api/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]
    # A job's task is a task create body with `key` and `metrics` beside its fields.
    item = task["schema"]["properties"]["tasks"]["items"]
    assert {"key", "metrics", "image"} <= set(item["properties"]), item
    assert "spec" not in item["properties"] and "key" in item["required"]
    bodies = generated_bodies(doc)
    assert len(bodies) >= 10
    refused = []
    for body in bodies:
        r = await api.client.post("/api/v1/jobs", json=body, headers=api.tenant)
        if r.status_code != 201:
            refused.append((body, r.status_code, r.text))
    assert not refused, "\n".join(sorted({text for _, _, text in refused}))
