"""The figures of a trace, per tenant and per queue, and the report: recorded beside replayed.

* wait: from entering `pending` (submission, a retry's requeue, a preemption) to a placement,
  every time, in seconds: p50 and p95 (nearest rank);
* GPU-hours: cards held × time held, to the end of the window for work still holding;
* preemptions: placements ended by a preemption, and the GPU-seconds they had run (lost);
* never placed: tasks still waiting when the window closes.
The text and the JSON are functions of the traces alone (sorted, fixed precision): the same
log and policy give the same bytes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .engine import Trace
from .policy import Policy
from .record import Recording

Scope = tuple[str, str]  # ("tenant" | "queue", name)
NO_QUEUE = "-"


@dataclass
class Figures:
    waits: list[float] = field(default_factory=list)
    gpu_seconds: float = 0.0
    preemptions: int = 0
    lost_gpu_seconds: float = 0.0
    never_placed: int = 0
    placements: int = 0

    def view(self) -> dict[str, Any]:
        return {
            "placements": self.placements,
            "wait_p50_s": _round(percentile(self.waits, 0.50)),
            "wait_p95_s": _round(percentile(self.waits, 0.95)),
            "gpu_hours": _round(self.gpu_seconds / 3600.0, 3),
            "preemptions": self.preemptions,
            "lost_gpu_seconds": _round(self.lost_gpu_seconds),
            "never_placed": self.never_placed,
        }


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest rank of the sorted values; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _round(x: float | None, digits: int = 1) -> float | None:
    return None if x is None else round(x, digits)


def figures(trace: Trace) -> dict[Scope, Figures]:
    out: dict[Scope, Figures] = {}

    def scopes(tenant: str, queue: str) -> list[Figures]:
        keys = [("tenant", tenant), ("queue", queue or NO_QUEUE)]
        return [out.setdefault(k, Figures()) for k in keys]

    for r in trace.runs:
        held = ((r.released_at or trace.until) - r.placed_at).total_seconds() * r.cards
        for f in scopes(r.tenant, r.queue):
            f.placements += 1
            f.waits.append((r.placed_at - r.pending_since).total_seconds())
            f.gpu_seconds += held
            if r.preempted:
                f.preemptions += 1
                f.lost_gpu_seconds += held
    for _, tenant, queue in trace.never_placed:
        for f in scopes(tenant, queue):
            f.never_placed += 1
    return out


def placements_of(trace: Trace) -> list[tuple[str, str, tuple[str, ...], str]]:
    """Each placement as (task, node, cards, time): what "reproduces" compares."""
    return [(r.task_id, r.node_id, r.gpu_ids, r.placed_at.isoformat()) for r in trace.runs]


def reproduced(recorded: Trace, same: Trace) -> tuple[int, int]:
    """(recorded placements the same-policy replay made alike, recorded placements)."""
    mine = placements_of(recorded)
    theirs = set(placements_of(same))
    return sum(1 for p in mine if p in theirs), len(mine)


@dataclass(frozen=True)
class Report:
    recording: Recording
    policy: Policy
    recorded: Trace
    replayed: Trace
    same_policy: tuple[int, int]  # reproduced, of
    autoscale: dict[str, Any] = field(default_factory=dict)  # autoscale.report

    def view(self) -> dict[str, Any]:
        rec, mine, theirs = self.recording, figures(self.recorded), figures(self.replayed)
        rows = []
        # Every tenant and queue with work in the window has its row, placed or not.
        named: set[Scope] = {("tenant", str(t.task.tenant_id)) for t in rec.tasks}
        named |= {("queue", t.queue or NO_QUEUE) for t in rec.tasks}
        for scope in sorted(mine.keys() | theirs.keys() | named):
            rows.append(
                {
                    "scope": scope[0],
                    "name": scope[1],
                    "recorded": mine.get(scope, Figures()).view(),
                    "replayed": theirs.get(scope, Figures()).view(),
                }
            )
        return {
            "since": rec.since.isoformat(),
            "until": rec.until.isoformat(),
            "events": rec.events,
            "tasks": len(rec.tasks),
            "policy": list(self.policy.sets),
            "same_policy_reproduces": {
                "placements": self.same_policy[0],
                "of": self.same_policy[1],
            },
            "withdrawn_waiting": {
                "recorded": sum(
                    1 for t in rec.tasks if t.withdrawn_at is not None and not t.attempts
                ),
                "replayed": self.replayed.withdrawn_waiting,
            },
            "rows": rows,
            "autoscale": self.autoscale,
        }

    def json(self) -> str:
        return json.dumps(self.view(), indent=2, sort_keys=True)

    def text(self) -> str:
        v = self.view()
        same = v["same_policy_reproduces"]
        head = [
            f"policy replay of {v['since']} .. {v['until']}: {v['events']} events,"
            f" {v['tasks']} tasks",
            "policy: " + (", ".join(v["policy"]) if v["policy"] else "as recorded"),
            f"the recorded policy replayed reproduces {same['placements']} of {same['of']}"
            " recorded placements (same task, node, cards and time)",
            "each cell: recorded > replayed",
            "",
        ]
        cols = ("wait p50 s", "wait p95 s", "GPU-h", "preempted", "GPU-s lost", "never placed")
        keys = (
            "wait_p50_s",
            "wait_p95_s",
            "gpu_hours",
            "preemptions",
            "lost_gpu_seconds",
            "never_placed",
        )
        table = [("SCOPE", "NAME", *(c.upper() for c in cols))]
        for row in v["rows"]:
            cells = [f"{_cell(row['recorded'][k])} > {_cell(row['replayed'][k])}" for k in keys]
            table.append((row["scope"], row["name"], *cells))
        widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table
        ]
        return "\n".join(head + lines + _autoscale_text(v["autoscale"])) + "\n"


def _autoscale_text(a: dict[str, Any]) -> list[str]:
    if not a.get("groups"):
        return []
    same = a["same_settings_reproduce"]
    keys = ("scale_events", "replica_hours", "gpu_hours", "above_target_s")
    table = [("GROUP", "NAME", "METRIC", "SCALE EVENTS", "REPLICA-H", "GPU-H", "ABOVE TARGET S")]
    for g in a["groups"]:
        cells = [f"{_cell(g['recorded'][k])} > {_cell(g['replayed'][k])}" for k in keys]
        table.append((g["group"], g["name"], g["metric"], *cells))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return [
        "",
        "autoscaler: the recorded settings replayed reproduce"
        f" {same['scale_decisions']} of {same['of']} recorded scale decisions"
        " (same time, from and to); the load is the recorded one",
        *("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table),
    ]


def _cell(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:g}"
    return str(x)
