"""Autoscaler replay, pure parts: a group's recorded samples re-run through the AutoScaler's
own decision (`autoscale_decision`). The log is written the way the AutoScaler writes it: a
sample each pass, a decision when the size changes, under a load (total requests/s) that
rises and falls; replayed as recorded it gives back every decision, a longer cooldown gives
fewer scale events, a lower target more replicas."""

from __future__ import annotations

from typing import Any

import pytest

from libs.domain.group.autoscale import AutoScale, Inputs, Replica, autoscale_decision
from libs.domain.group.events import GroupScaled
from libs.domain.group.policy import decided, sampled
from libs.domain.reasons import ReasonCode
from services.scheduler.replay import parse_sets
from services.scheduler.replay.autoscale import AutoscaleLog, GroupLog, recorded, replayed, report

CFG = AutoScale(
    metric="qps", target=20, min_replicas=1, max_replicas=10, cooldown_up_s=60, cooldown_down_s=120
)
T0 = 1_800_000_000.0
INTERVAL = 30.0
# Requests/s over the group, one figure per 30 s pass: up to 190 and back down.
LOAD = [10, 30, 60, 100, 150, 190, 190, 170, 120, 80, 40, 20, 10, 10, 10, 10, 10, 10, 10, 10]


def write_log(cfg: AutoScale = CFG, load: list[int] = LOAD) -> tuple[AutoscaleLog, float]:
    """What the AutoScaler records over `load`: (the log, the last pass's time)."""
    log = AutoscaleLog()
    current, born = 1, [T0 - 600]
    last_up: float | None = None
    last_scale: float | None = None
    t = T0
    for total in load:
        inp = Inputs(
            current=current,
            metric=total / current,
            now=t,
            last_up_at=last_up,
            last_scale_at=last_scale,
            gpu_per_replica=1.0,
        )
        reps = [Replica(str(r), r, t - b) for r, b in enumerate(born)]
        d = autoscale_decision(cfg, inp, reps, split=True, min_age_s=60)
        s = sampled("g1", cfg, inp, reps, interval_s=INTERVAL, split=True, min_replica_age_s=60)
        log.add(s, t, "web")
        log.add(decided("g1", cfg.metric, inp.metric, d), t, "web")
        if d.changes:
            ev = GroupScaled(
                group_id="g1",
                from_replicas=current,
                to_replicas=d.replicas,
                source="autoscaler",
                reason_code=ReasonCode.AUTOSCALE,
                reason="",
            )
            log.add(ev, t, "web")
            if d.replicas > current:
                born += [t] * (d.replicas - current)
                last_up = t
            born = born[: d.replicas]
            current, last_scale = d.replicas, t
        t += INTERVAL
    return log, t - INTERVAL


def group(log: AutoscaleLog) -> GroupLog:
    (g,) = log.window(0.0)
    return g


def test_replayed_as_recorded_gives_back_every_decision() -> None:
    log, until = write_log()
    g = group(log)
    assert len(g.changes) >= 4  # up several times, then down
    same = replayed(g, None, until)
    assert same.changes == g.changes
    assert same.view() == recorded(g, until).view()


def test_a_longer_cooldown_gives_fewer_scale_events() -> None:
    log, until = write_log()
    g = group(log)
    longer = replayed(g, {"cooldown_up_s": 600, "cooldown_down_s": 600}, until)
    assert 0 < len(longer.changes) < len(g.changes)


def test_a_lower_target_gives_more_replicas() -> None:
    log, until = write_log()
    g = group(log)
    base, lower = recorded(g, until), replayed(g, {"target": 10}, until)
    assert lower.replica_s > base.replica_s
    assert lower.gpu_s > base.gpu_s
    assert lower.changes[0][2] > g.changes[0][2]  # the first scale-up goes further


def test_a_scale_by_hand_after_the_replay_parted_is_kept() -> None:
    """No scale-down in the replay (a cooldown longer than the log), so it parts from the
    log at the first recorded one; a scale to 5 by hand later sets its size as in the log."""
    over = {"cooldown_down_s": 10_000}
    log, until = write_log()
    without = replayed(group(log), over, until)
    log.add(
        GroupScaled(
            group_id="g1",
            from_replicas=1,
            to_replicas=5,
            source="user",
            reason_code=ReasonCode.AUTOSCALE,
            reason="",
        ),
        T0 + 15 * INTERVAL + 1,
        "web",
    )
    held = replayed(group(log), over, until)
    assert [c[2] for c in without.changes] == [2, 5, 10]
    assert held.changes == without.changes  # the scale by hand is not the AutoScaler's
    assert held.replica_s == pytest.approx(without.replica_s - 5 * (until - T0 - 16 * INTERVAL))


@pytest.mark.parametrize(
    ("sets", "over"),
    [
        (["autoscaler.web.target=10"], {"web": {"target": 10.0}}),
        (
            ["autoscaler.g1.cooldown_up_s=300", "autoscaler.g1.max_replicas=4"],
            {"g1": {"cooldown_up_s": 300.0, "max_replicas": 4}},
        ),
    ],
    ids=["by name", "by id"],
)
def test_the_report_names_the_group_by_id_or_name(
    sets: list[str], over: dict[str, dict[str, Any]]
) -> None:
    policy = parse_sets(sets)
    assert {k: dict(v) for k, v in policy.autoscaler.items()} == over
    log, until = write_log()
    out = report(log, 0.0, until, policy.autoscaler)
    (row,) = out["groups"]
    assert row["group"] == "g1" and row["name"] == "web" and row["settings"]
    assert row["replayed"] != row["recorded"]
    same = out["same_settings_reproduce"]
    assert same["scale_decisions"] == same["of"] == len(group(log).changes)
