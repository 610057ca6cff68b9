"""Policy replay: the recorded history re-run through the placement core under a changed
policy, on a simulated clock, reported beside what really happened (docs/operations.md,
"Policy replay").

`record` reads the event log into the replay's inputs and the recorded trace, `policy` parses
and applies `--set KEY=VALUE`, `engine` runs the simulation through `Planner.plan`, `autoscale`
re-runs the AutoScaler's decision over its recorded samples, `report`
computes the figures per tenant and queue and renders them. Nothing here does I/O: the caller
hands in the log's rows (heteroflow/cli_policy.py reads them from the store).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from . import autoscale
from .engine import Trace, recorded_trace, replay
from .policy import Policy, PolicyError, parse_sets, unknown_names
from .record import Recording, record
from .report import Report, figures, reproduced

__all__ = [
    "Policy",
    "PolicyError",
    "Recording",
    "Report",
    "Trace",
    "figures",
    "parse_sets",
    "record",
    "recorded_trace",
    "replay",
    "replay_report",
    "report_for",
    "reproduced",
    "unknown_names",
]


def replay_report(
    events: Iterable[tuple[str, str, int, str, str, datetime]],
    policy: Policy,
    since: datetime | None = None,
) -> Report:
    """The log's window from `since` replayed under `policy`, beside what happened, with how
    much of it the recorded policy reproduces."""
    return report_for(record(events, since), policy)


def report_for(rec: Recording, policy: Policy) -> Report:
    """`rec` replayed under `policy` (and under the recorded policy, to say how faithful)."""
    recorded = recorded_trace(rec)
    same = replay(rec, Policy())
    changed = replay(rec, policy) if policy.changed else same
    scaled = autoscale.report(
        rec.autoscale, rec.since.timestamp(), rec.until.timestamp(), policy.autoscaler
    )
    return Report(rec, policy, recorded, changed, reproduced(recorded, same), scaled)
