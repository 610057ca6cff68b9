"""The liveness floor of inference tasks (SPEC §5, docs/serving.md#liveness), pure.

Agents report, on each heartbeat, what they see of each inference task: the container's
state and, when the task declares `serving.health_path`, whether it answers 2xx. A running
task is declared dead only when it has shown no positive liveness for the floor (15 minutes
by default) AND at least two independent signals of death hold at once: the container is
gone or not running, the heartbeats carry no evidence of it any more, the health endpoint
fails. GPU idleness is never a signal: an idle model server is healthy.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class Health(StrEnum):
    OK = "ok"
    FAILING = "failing"
    NONE = ""  # no health endpoint declared


class TaskLiveness(BaseModel):
    """One task's evidence in one heartbeat."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    container: str  # the runtime's RunState: running, paused, exited, missing, created
    health: Health = Health.NONE

    @property
    def positive(self) -> bool:
        return self.container == "running" and self.health is not Health.FAILING


@dataclass
class LivenessWatch:
    """What the node monitor remembers of one running inference task."""

    node_id: str
    first_seen: float
    last_evidence_at: float
    evidence: TaskLiveness
    last_positive: float | None = None

    def observe(self, evidence: TaskLiveness, now: float) -> None:
        self.evidence, self.last_evidence_at = evidence, now
        if evidence.positive:
            self.last_positive = now


def death_signals(watch: LivenessWatch, now: float, stale_s: float) -> list[str]:
    """The independent signals of death that hold now (an empty list: none)."""
    out: list[str] = []
    if watch.evidence.container != "running":
        out.append(f"container {watch.evidence.container}")
    if now - watch.last_evidence_at > stale_s:
        out.append(f"no heartbeat evidence for {now - watch.last_evidence_at:.0f}s")
    if watch.evidence.health is Health.FAILING:
        out.append("health endpoint failing")
    return out


def is_dead(watch: LivenessWatch, now: float, floor_s: float, stale_s: float) -> list[str]:
    """The signals when the task is to be declared dead; [] while it is (or may be) alive."""
    since = watch.last_positive if watch.last_positive is not None else watch.first_seen
    if now - since < floor_s:
        return []
    signals = death_signals(watch, now, stale_s)
    return signals if len(signals) >= 2 else []
