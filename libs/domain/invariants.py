"""The history checker's invariants: one streaming pass over the event log that proves what the
store promises, or names each place where it does not (`heteroflow check history`).

Events are fed in position order (the order they were written). The checker keeps only
per-stream, per-task and per-card state, so memory grows with the number of tasks and cards,
never with the length of the log. What it proves:

* every stream's versions run 1, 2, 3 … without a gap, and a task stream starts with its
  `task_created` (so every acknowledged create is present: a create is acknowledged when that
  event commits);
* every status change starts where the task was and follows the whitelist of states.py, for
  the actor that made it; a task leaves a terminal state only by a retry, while retries remain;
* a task placed on one node is never reported on another without first leaving it;
* no GPU card holds more than its whole compute or more than its VRAM at any point of the log
  (a sleeper's lent card counts for its borrower only, from the loan to its return);
* (with the store) every timeline entry comes from a committed event (`unsourced_timeline`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import ValidationError

from libs.domain.catalog import PAYLOAD_TYPES, Payload
from libs.domain.node.events import NodeRegistered
from libs.domain.task.events import TaskConfigUpdated, TaskCreated, TaskStatusChanged
from libs.domain.task.lending import TaskCardLent, TaskCardReturned
from libs.domain.task.states import GPU_HOLDING, TERMINAL, Actor, TaskStatus, is_allowed

S = TaskStatus
EPSILON = 1e-9
# The spec fields the checker follows (GPU request and retry budget).
SPEC_FIELDS = ("gpu_required", "gpu_memory_mb", "gpu_compute_ratio", "max_retries")


class Invariant(StrEnum):
    """What a violation broke; the codes printed and counted by the checker."""

    UNREADABLE = "unreadable_event"
    VERSION_GAP = "version_gap"
    MISSING_CREATE = "missing_create"
    STREAM_MISMATCH = "stream_mismatch"
    FROM_STATUS = "from_status_mismatch"
    ILLEGAL_TRANSITION = "illegal_transition"
    TERMINAL_REOPENED = "terminal_reopened"
    TWO_NODES = "task_on_two_nodes"
    CARD_OVERCOMMITTED = "card_overcommitted"
    TIMELINE_UNSOURCED = "timeline_without_event"


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """One row of the event log as the checker reads it (payload as stored JSON text)."""

    position: int
    event_id: str
    stream_id: str
    stream_type: str
    version: int
    type: str
    payload: str
    occurred_at: datetime


@dataclass(frozen=True, slots=True)
class EventRef:
    """An event named in a violation: where it is in the log and what it said."""

    position: int
    event_id: str
    stream_id: str
    version: int
    type: str
    summary: str = ""

    def view(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "event_id": self.event_id,
            "stream_id": self.stream_id,
            "version": self.version,
            "type": self.type,
            "summary": self.summary,
        }

    def line(self) -> str:
        return (
            f"#{self.position} {self.stream_id} v{self.version} {self.type}"
            f"{': ' + self.summary if self.summary else ''} (event {self.event_id})"
        )


@dataclass(frozen=True, slots=True)
class Violation:
    invariant: Invariant
    message: str
    events: tuple[EventRef, ...] = ()

    def view(self) -> dict[str, Any]:
        return {
            "invariant": self.invariant.value,
            "message": self.message,
            "events": [e.view() for e in self.events],
        }


@dataclass(frozen=True, slots=True)
class _Share:
    """What one task holds on one card: its compute share and VRAM (None: card unknown)."""

    ratio: float
    vram_mb: int | None
    placed: EventRef


@dataclass(slots=True)
class _Task:
    status: TaskStatus
    last: EventRef  # the event that set the current status
    whole_gpus: int
    frac_vram_mb: int
    frac_ratio: float
    max_retries: int
    created: bool = True  # False: a stand-in for a stream that did not start with its creation
    retry_count: int = 0
    node_id: str | None = None
    gpu_ids: tuple[str, ...] = ()
    placed: EventRef | None = None  # the event that gave the current placement
    held: tuple[tuple[str, str], ...] = ()  # the cards counted for it now
    lent: bool = False  # a sleeper whose cards a borrower holds (lending.py): not counted

    def set_spec(self, spec: dict[str, Any]) -> None:
        whole = int(spec.get("gpu_required", self.whole_gpus) or 0)
        self.whole_gpus = whole
        # A whole-card request ignores the fraction fields (as the scheduler does).
        self.frac_vram_mb = 0 if whole else int(spec.get("gpu_memory_mb", self.frac_vram_mb) or 0)
        self.frac_ratio = 0.0 if whole else float(spec.get("gpu_compute_ratio", self.frac_ratio))
        self.max_retries = int(spec.get("max_retries", self.max_retries))


def summarise(payload: Payload) -> str:
    """A one-line reading of an event for people (used in violation listings)."""
    if isinstance(payload, TaskStatusChanged):
        where = f" on {payload.node_id}" if payload.node_id else ""
        cards = f" [{', '.join(payload.gpu_ids)}]" if payload.gpu_ids else ""
        clear = " (placement cleared)" if payload.clear_placement else ""
        return (
            f"{payload.from_status.value} -> {payload.to_status.value} by {payload.actor}"
            f"{where}{cards}{clear}"
        )
    if isinstance(payload, TaskCreated):
        return f"created for tenant {payload.tenant_id}"
    if isinstance(payload, NodeRegistered):
        cards = ", ".join(f"{g.id} {g.vram_mb} MB" for g in payload.inventory.gpus)
        return f"node {payload.node_id} registered [{cards}]"
    return ""


class HistoryChecker:
    """Feed events in position order, then read `violations` (at most `max_reported` kept;
    `counts` counts them all)."""

    def __init__(self, max_reported: int = 1000) -> None:
        self.max_reported = max_reported
        self.events = 0
        self.counts: Counter[Invariant] = Counter()
        self.violations: list[Violation] = []
        self._streams: dict[str, EventRef] = {}
        self._tasks: dict[str, _Task] = {}
        self._cards: dict[tuple[str, str], dict[tuple[str, int], _Share]] = {}
        self._vram: dict[tuple[str, str], int] = {}

    @property
    def clean(self) -> bool:
        return not any(self.counts.values())

    def report(self, violation: Violation) -> None:
        self.counts[violation.invariant] += 1
        if len(self.violations) < self.max_reported:
            self.violations.append(violation)

    def feed_all(self, events: Iterable[LoggedEvent]) -> None:
        for ev in events:
            self.feed(ev)

    def feed(self, ev: LoggedEvent) -> None:
        self.events += 1
        ref = EventRef(ev.position, ev.event_id, ev.stream_id, ev.version, ev.type)
        payload = self._parse(ev, ref)
        if payload is not None:
            ref = EventRef(*_key(ref), summarise(payload))
        self._check_version(ev, ref)
        if payload is None:
            return
        if payload.stream_type != ev.stream_type:
            self._flag(Invariant.STREAM_MISMATCH, f"a {ev.type} in a {ev.stream_type} stream", ref)
        elif isinstance(payload, NodeRegistered):
            for card in payload.inventory.gpus:
                self._vram[(payload.node_id, card.id)] = card.vram_mb
        elif ev.stream_type == "task":
            self._task_event(ev, ref, payload)

    def expect_created(self, task_ids: Iterable[str]) -> None:
        """After the log: every task id a client was told was created must have a stream."""
        for task_id in task_ids:
            task = self._tasks.get(task_id)
            if task is None or not task.created:
                self._flag(
                    Invariant.MISSING_CREATE,
                    f"task {task_id} was acknowledged but the log holds no task_created for it",
                )

    # --- per event ---------------------------------------------------------------------

    def _flag(self, invariant: Invariant, message: str, *refs: EventRef | None) -> None:
        self.report(Violation(invariant, message, tuple(r for r in refs if r is not None)))

    def _parse(self, ev: LoggedEvent, ref: EventRef) -> Payload | None:
        cls = PAYLOAD_TYPES.get(ev.type)
        if cls is None:
            self._flag(Invariant.UNREADABLE, f"unknown event type {ev.type!r}", ref)
            return None
        try:
            return cls.model_validate_json(ev.payload)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "payload"
            self._flag(Invariant.UNREADABLE, f"{ev.type} payload: {where}: {first['msg']}", ref)
            return None

    def _check_version(self, ev: LoggedEvent, ref: EventRef) -> None:
        prev = self._streams.get(ev.stream_id)
        expected = prev.version + 1 if prev else 1
        if ev.version != expected:
            self._flag(
                Invariant.VERSION_GAP,
                f"stream {ev.stream_id}: version {ev.version} follows "
                f"{prev.version if prev else 'nothing'} (expected {expected})",
                prev,
                ref,
            )
        if prev is None or ev.version > prev.version:
            self._streams[ev.stream_id] = ref

    def _task_event(self, ev: LoggedEvent, ref: EventRef, payload: Payload) -> None:
        task_id = getattr(payload, "task_id", None)
        if task_id != ev.stream_id:
            self._flag(Invariant.STREAM_MISMATCH, f"about task {task_id}, in {ev.stream_id}", ref)
            return
        task = self._tasks.get(task_id)
        if isinstance(payload, TaskCreated):
            if task is not None:
                what = "created twice" if task.created else "created after its other events"
                self._flag(Invariant.MISSING_CREATE, f"task {task_id} {what}", task.last, ref)
                return
            spec = payload.spec
            self._tasks[task_id] = task = _Task(S.PENDING, ref, 0, 0, 0.0, spec.max_retries)
            task.set_spec({f: getattr(spec, f) for f in SPEC_FIELDS})
            return
        if task is None:
            self._flag(
                Invariant.MISSING_CREATE,
                f"task {task_id}: {ev.type} with no task_created before it",
                ref,
            )
            # Go on from what the event says, so one missing creation is reported once.
            start = payload.from_status if isinstance(payload, TaskStatusChanged) else S.PENDING
            task = self._tasks[task_id] = _Task(start, ref, 0, 0, 0.0, 0, created=False)
        if isinstance(payload, TaskConfigUpdated):
            task.set_spec(payload.changes)
        elif isinstance(payload, TaskStatusChanged):
            self._transition(task_id, task, ref, payload)
        elif isinstance(payload, TaskCardLent | TaskCardReturned):
            # While lent, the card is counted on the borrower only (the sleeper released it).
            task.lent = isinstance(payload, TaskCardLent)
            self._hold(task_id, task, ref)

    def _transition(self, task_id: str, task: _Task, ref: EventRef, ev: TaskStatusChanged) -> None:
        src, dst = task.status, ev.to_status
        if ev.from_status is not src:
            self._flag(
                Invariant.FROM_STATUS,
                f"task {task_id} was {src.value}, the event says it left {ev.from_status.value}",
                task.last,
                ref,
            )
        self._check_edge(task_id, task, ref, ev)
        self._check_node(task_id, task, ref, ev)
        task.status, task.last = dst, ref
        if dst in (S.WAKING, S.RUNNING):
            task.lent = False  # awake: its card is its own again (a return comes first)
        if ev.retry_count is not None:
            task.retry_count = ev.retry_count
        if ev.clear_placement:
            task.node_id, task.gpu_ids, task.placed = None, (), None
        if ev.node_id is not None and ev.node_id != task.node_id:
            task.node_id, task.placed = ev.node_id, ref
        if ev.gpu_ids is not None and ev.gpu_ids != task.gpu_ids:
            task.gpu_ids, task.placed = ev.gpu_ids, ref
        self._hold(task_id, task, ref)

    def _check_edge(self, task_id: str, task: _Task, ref: EventRef, ev: TaskStatusChanged) -> None:
        src, dst = task.status, ev.to_status
        edge = f"{src.value} -> {dst.value} by {ev.actor}"
        retry = src is S.FAILED and dst is S.PENDING
        if src in TERMINAL and not retry:
            self._flag(
                Invariant.TERMINAL_REOPENED, f"task {task_id} left terminal {edge}", task.last, ref
            )
        elif not is_allowed(src, dst, _actor(ev.actor)):
            self._flag(
                Invariant.ILLEGAL_TRANSITION,
                f"task {task_id}: {edge} is not in the whitelist",
                task.last,
                ref,
            )
        elif retry and ev.requeues is None and task.retry_count >= task.max_retries:
            # (a device requeue, `requeues` set, spends no retry: docs/operations.md)
            self._flag(
                Invariant.ILLEGAL_TRANSITION,
                f"task {task_id} retried with its retries spent "
                f"({task.retry_count}/{task.max_retries})",
                task.last,
                ref,
            )

    def _check_node(self, task_id: str, task: _Task, ref: EventRef, ev: TaskStatusChanged) -> None:
        # A placed task may only be moved after its placement is given up (`clear_placement`,
        # which goes with leaving the node); a new node on a placed task means two nodes.
        if (
            task.status in GPU_HOLDING
            and task.node_id is not None
            and ev.node_id is not None
            and ev.node_id != task.node_id
            and not ev.clear_placement
        ):
            self._flag(
                Invariant.TWO_NODES,
                f"task {task_id} is on {task.node_id} and the event puts it on {ev.node_id}",
                task.placed,
                ref,
            )

    # --- cards -------------------------------------------------------------------------

    def _hold(self, task_id: str, task: _Task, ref: EventRef) -> None:
        """Recount what the task holds on its cards after a change; check the cards it adds."""
        node = task.node_id
        cards = (
            tuple((node, g) for g in task.gpu_ids)
            if node and task.status in GPU_HOLDING and not task.lent
            else ()
        )
        if cards == task.held:
            return
        for i, card in enumerate(task.held):
            self._cards.get(card, {}).pop((task_id, i), None)
        task.held = cards
        for i, card in enumerate(cards):
            # Keyed by position: the same card listed twice is counted twice (over-committed).
            holders = self._cards.setdefault(card, {})
            share = holders[(task_id, i)] = self._share(task, card, task.placed or ref)
            if share.ratio or share.vram_mb:
                self._check_card(card, holders, ref)

    def _share(self, task: _Task, card: tuple[str, str], placed: EventRef) -> _Share:
        vram = self._vram.get(card)
        if task.whole_gpus:
            return _Share(1.0, vram, placed)
        # As the scheduler accounts a fraction (services/scheduler/placement/model.py
        # `share_on`): a request naming one dimension holds the matching share of the other.
        need = task.frac_vram_mb or (math.ceil(task.frac_ratio * vram) if vram else 0)
        ratio = task.frac_ratio or (min(1.0, need / vram) if vram else 0.0)
        return _Share(ratio, need or None, placed)

    def _check_card(
        self, card: tuple[str, str], holders: dict[tuple[str, int], _Share], ref: EventRef
    ) -> None:
        ratio = sum(s.ratio for s in holders.values())
        vram = self._vram.get(card)
        used = sum(s.vram_mb or 0 for s in holders.values())
        over_vram = vram is not None and used > vram
        if ratio <= 1.0 + EPSILON and not over_vram:
            return
        node, gpu = card
        size = f"{vram} MB" if vram is not None else "unknown size"
        refs = sorted({s.placed for s in holders.values()} | {ref}, key=lambda r: r.position)
        self._flag(
            Invariant.CARD_OVERCOMMITTED,
            f"card {gpu} on {node} ({size}) held by {len(holders)} task(s): "
            f"{ratio:.2f} of its compute, {used} MB of VRAM",
            *refs,
        )


def _key(ref: EventRef) -> tuple[int, str, str, int, str]:
    return ref.position, ref.event_id, ref.stream_id, ref.version, ref.type


def _actor(name: str) -> Actor | None:
    try:
        return Actor(name)
    except ValueError:
        return None


def unsourced_timeline(entry_id: str, subject: str, kind: str, why: str) -> Violation:
    """A timeline entry that no committed event explains (found by the store's query)."""
    return Violation(
        Invariant.TIMELINE_UNSOURCED, f"timeline entry {entry_id} ({kind} on {subject}): {why}"
    )
