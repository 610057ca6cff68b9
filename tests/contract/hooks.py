"""Schemathesis hooks: test data for the fields that name another resource.

A body field that names another resource can be valid by its schema and still name nothing:
`queue` must be one of the tenant's queues (SPEC seed 004; unknown → 400 naming `queue`).
The installation under test has none, so a generated queue name becomes "" (the tenant's
default), the way one would seed known identifiers. Only values the schema allows are
replaced: a negative case stays negative.
"""

from __future__ import annotations

from typing import Any

import schemathesis

QUEUE_MAX = 64
CREATES = frozenset({"/api/v1/tasks", "/api/v1/task-groups", "/api/v1/jobs"})


@schemathesis.hook
def map_body(context: schemathesis.HookContext, body: Any) -> Any:
    operation = context.operation
    if operation is None or operation.path not in CREATES or not isinstance(body, dict):
        return body
    queue = body.get("queue")
    if isinstance(queue, str) and len(queue) <= QUEUE_MAX:
        return body | {"queue": ""}
    return body
