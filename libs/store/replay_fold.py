"""Replay's fold: task streams evolved as plain dicts, every other aggregate through its model.

Almost every stored event is a task's (five or more per task against a handful per node,
group, job, pool or queue), and parsing each one into a frozen pydantic model and copying an
immutable `Task` per event held replay near 11k events/s. Here a task is kept as the document
its projection row stores (`Task.model_dump(mode="json")`, except that the timestamps the fold
sets from `occurred_at` stay datetimes until the row is written), and each event's fields are
applied to it in place, as `libs.domain.events.evolve_task` applies them to the model.

Only a payload in the current shape takes the dict path: exactly the payload model's fields
at its current schema version, so there is no default to fill in and no upcast to apply (the
store holds what `model_dump(mode="json")` of a validated payload gave). Anything else (an
older schema version, `task_config_updated` whose changes are re-validated, a shape this fold
does not know, an event before `task_created`) takes the live path for that one event: the
document is loaded into `Task`, `evolve_task` runs, and the result is dumped back.

tests/unit/test_replay_fold.py holds this fold and the live projections equal, row by row
after every event, over 100k generated events of every kind the projections handle: a change
to `evolve_task` that is not mirrored here fails it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import orjson
from pydantic import BaseModel

from libs.domain.catalog import PAYLOAD_TYPES
from libs.domain.payload import Payload
from libs.domain.reasons import ReasonCode
from libs.domain.task.events import (
    TaskCreated,
    TaskDeleted,
    TaskDrainMarked,
    TaskPendingReason,
    TaskRetryDecided,
    TaskStatusChanged,
)
from libs.domain.task.evolve import CARRIED_FIELDS, CLEARED_PLACEMENT, SLEEP_ONLY, evolve_task
from libs.domain.task.model import Task, TaskId, TaskSpec, TenantId
from libs.domain.task.states import TaskStatus

from .projections import AGGREGATES, TASKS

Doc = dict[str, Any]

# Timestamps set from the event's `occurred_at`: datetimes in the document (they are also
# columns of the row); orjson writes them as pydantic does (`...Z` for UTC, else `+hh:mm`).
AT_FIELDS = ("created_at", "updated_at", "started_at", "finished_at", "deleted_at")
_DUMPS_OPTIONS = orjson.OPT_UTC_Z

# Every field of a new task at its default, as the projection document holds it.
_TEMPLATE: Doc = Task(
    id=TaskId("-"),
    tenant_id=TenantId("-"),
    spec=TaskSpec(name="-"),
    created_at=datetime.min,
    updated_at=datetime.min,
).model_dump(mode="json")
_SPEC_KEYS = frozenset(TaskSpec.model_fields)
# As JSON: the tuple of no cards is a list in a document.
_CLEARED: Doc = {k: list(v) if isinstance(v, tuple) else v for k, v in CLEARED_PLACEMENT.items()}
_CARRIED = CARRIED_FIELDS
_RUNNING = TaskStatus.RUNNING.value
_PENDING = TaskStatus.PENDING.value
_SLEEPING = TaskStatus.SLEEPING.value
_FINISHED = frozenset(
    s.value
    for s in (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.STOPPED)
)
_SUBMITTED = ReasonCode.SUBMITTED.value


def _created(doc: Doc | None, p: Doc, at: datetime, version: int) -> Doc | None:
    if p["spec"].keys() != _SPEC_KEYS:
        return None  # a spec from an older model: let TaskSpec fill in its defaults
    new = _TEMPLATE.copy()  # shallow: the fold replaces values, it never mutates them
    new.update(
        id=p["task_id"],
        tenant_id=p["tenant_id"],
        spec=p["spec"],
        group_id=p["group_id"],
        rank=p["rank"],
        generation=p["generation"],
        status_reason_code=_SUBMITTED,
        version=version,
        created_at=at,
        updated_at=at,
    )
    return new


def _status_changed(doc: Doc, p: Doc, at: datetime) -> None:
    """`_status_changes` of libs/domain/task/evolve.py, on the document."""
    to = p["to_status"]
    was_started = doc["started_at"] is not None
    doc["status"] = to
    doc["status_reason_code"] = p["reason_code"]
    doc["status_reason"] = p["reason"]
    doc["pending_reason"] = ""
    doc["pending_reason_code"] = None
    if p["clear_placement"]:
        doc.update(_CLEARED)
    for name in _CARRIED:
        value = p[name]
        if value is not None:
            doc[name] = value
    if to != _SLEEPING:
        doc.update(SLEEP_ONLY)
    if p["retry_count"] is not None:
        doc["retry_count"] = p["retry_count"]
    if p.get("requeues") is not None:
        doc["requeues"] = p["requeues"]
    if p["memory_mb"] is not None:
        doc["spec"] = {**doc["spec"], "memory_mb": p["memory_mb"]}
    if to == _RUNNING and not was_started:
        doc["started_at"] = at
    if to == _PENDING:
        doc.update(started_at=None, finished_at=None, exit_code=None, result="")
        doc["borrowed_from"] = ""
        doc["not_before"] = p["not_before"]
        doc["same_node_id"] = p["same_node_id"] or ""
        doc["avoid_node_ids"] = p["avoid_node_ids"] or []
        doc["min_vram_mb"] = p["min_vram_mb"] or 0
        if p["error"] is None:
            doc["error"] = ""
    elif to in _FINISHED:
        doc["finished_at"] = at


def _pending_reason(doc: Doc, p: Doc, at: datetime) -> None:
    doc["pending_reason"] = p["reason"]
    doc["pending_reason_code"] = p["reason_code"]


def _drain_marked(doc: Doc, p: Doc, at: datetime) -> None:
    doc["draining"] = True


def _deleted(doc: Doc, p: Doc, at: datetime) -> None:
    doc["deleted_at"] = at


def _retry_decided(doc: Doc, p: Doc, at: datetime) -> None:
    """`RetryVerdict` of libs/domain/task/evolve.py, on the document."""
    doc["retry"] = {
        "verdict": p["action"],
        "reason": p["reason"],
        "failure_class": p["failure_class"],
        "attempt": p["attempt"],
        "decided_at": at,
    }


Apply = Callable[[Doc, Doc, datetime], None]
_APPLY: dict[str, Apply] = {
    TaskStatusChanged.type: _status_changed,
    TaskPendingReason.type: _pending_reason,
    TaskDrainMarked.type: _drain_marked,
    TaskDeleted.type: _deleted,
    TaskRetryDecided.type: _retry_decided,
}


def _shape(cls: type[Payload]) -> tuple[frozenset[str], int]:
    return frozenset(cls.model_fields), int(cls.model_fields["schema_version"].default)


# The current shape of each payload the dict path handles: its field names, its version.
_SHAPES: dict[str, tuple[frozenset[str], int]] = {
    cls.type: _shape(cls)
    for cls in (
        TaskCreated,
        TaskStatusChanged,
        TaskPendingReason,
        TaskDrainMarked,
        TaskDeleted,
        TaskRetryDecided,
    )
}


def _to_doc(task: Task) -> Doc:
    doc = task.model_dump(mode="json")
    for name in AT_FIELDS:
        doc[name] = getattr(task, name)
    return doc


class TaskFold:
    """Task documents by stream id, folded from payload JSON text."""

    def __init__(self) -> None:
        self.docs: dict[str, Doc] = {}

    def apply(self, stream_id: str, event_type: str, text: str, at: datetime, version: int) -> None:
        p = orjson.loads(text)
        doc = self.docs.get(stream_id)
        shape = _SHAPES.get(event_type)
        if shape is not None and p.keys() == shape[0] and p["schema_version"] == shape[1]:
            if event_type == TaskCreated.type:
                new = _created(doc, p, at, version)
                if new is not None:
                    self.docs[stream_id] = new
                    return
            elif doc is not None:
                _APPLY[event_type](doc, p, at)
                doc["version"] = version
                doc["updated_at"] = at
                return
        self.docs[stream_id] = self._live(doc, event_type, text, at, version)

    @staticmethod
    def _live(doc: Doc | None, event_type: str, text: str, at: datetime, version: int) -> Doc:
        """The live path for one event: the model, `evolve_task`, the document again."""
        task = None if doc is None else Task.model_validate(doc)
        payload = PAYLOAD_TYPES[event_type].model_validate_json(text)
        return _to_doc(evolve_task(task, payload, at, version))

    @staticmethod
    def row(doc: Doc) -> tuple[Any, ...]:
        """`projections.task_row` of the document: JSON columns as JSON text."""
        spec = doc["spec"]
        return (
            doc["id"],
            doc["tenant_id"],
            doc["status"],
            spec["name"],
            doc["node_id"],
            spec["priority"],
            doc["group_id"],
            orjson.dumps(spec["labels"]).decode(),
            doc["version"],
            doc["created_at"],
            doc["updated_at"],
            doc["deleted_at"],
            orjson.dumps(doc, option=_DUMPS_OPTIONS).decode(),
        )


class ReplayFold:
    """Every aggregate's state after the events applied so far, in position order."""

    def __init__(self) -> None:
        self.tasks = TaskFold()
        self.models: dict[str, dict[str, BaseModel]] = {
            t: {} for t in AGGREGATES if t != TASKS.stream_type
        }

    def apply(
        self,
        stream_id: str,
        stream_type: str,
        version: int,
        event_type: str,
        text: str,
        at: datetime,
    ) -> bool:
        """Fold one stored event; False when it is not an aggregate's (tenants, keys, ...)."""
        if stream_type == TASKS.stream_type:
            self.tasks.apply(stream_id, event_type, text, at, version)
            return True
        states = self.models.get(stream_type)
        if states is None:
            return False
        payload = PAYLOAD_TYPES[event_type].model_validate_json(text)
        evolve = AGGREGATES[stream_type].evolve
        states[stream_id] = evolve(states.get(stream_id), payload, at, version)
        return True

    def row(self, stream_type: str, stream_id: str) -> tuple[Any, ...]:
        """The projection row of one aggregate as it stands."""
        if stream_type == TASKS.stream_type:
            return TaskFold.row(self.tasks.docs[stream_id])
        return AGGREGATES[stream_type].row(self.models[stream_type][stream_id])

    def tables(self) -> Iterator[tuple[str, Iterator[tuple[Any, ...]]]]:
        """(table, its rows) for every aggregate table."""
        yield TASKS.table, map(TaskFold.row, self.tasks.docs.values())
        for stream_type, states in self.models.items():
            agg = AGGREGATES[stream_type]
            yield agg.table, map(agg.row, states.values())
