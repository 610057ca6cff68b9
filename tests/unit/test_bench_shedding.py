"""The shedding benchmark's verdicts: each target of the load test judged from what came back."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.shedding import Outcomes, report, verdicts


def outcomes(
    served: list[float], shed: list[float] | None = None, other: int = 0, ids: int = 0
) -> Outcomes:
    shed = shed or []
    return Outcomes(
        sent=len(served) + len(shed) + other,
        served=served,
        shed=shed,
        other=Counter({"timed out": other}) if other else Counter(),
        ids=[f"t{i}" for i in range(ids)],
    )


FAST = [0.010] * 200


def judged(creates: Outcomes, lists: Outcomes, lost: int = 0) -> dict[str, bool]:
    return {v.target.split(" <=")[0].split(" (")[0]: v.met for v in verdicts(creates, lists, lost)}


def test_a_run_within_every_target_passes() -> None:
    checks = verdicts(outcomes(FAST, [0.004] * 50, ids=200), outcomes(FAST), 0)
    assert all(c.met for c in checks), checks
    text = report("mixed", "50 requests/s", checks)
    assert text.endswith("shedding.mixed: PASS") and text.count("PASS  ") == 5


@pytest.mark.parametrize(
    ("creates", "lists", "lost", "failed"),
    [
        (outcomes(FAST), outcomes([0.010] * 197 + [0.2] * 3), 0, "lists p99"),
        # Three lists of 200 shed: over 1 % not served, a miss however fast the rest.
        (outcomes(FAST), outcomes([0.010] * 197, shed=[0.001] * 3), 0, "lists p99"),
        (outcomes([0.5] * 197 + [1.5] * 3), outcomes(FAST), 0, "creates served p99"),
        (outcomes(FAST, shed=[0.01] * 90 + [0.2] * 10), outcomes(FAST), 0,
         "creates shed answered p99"),
        (outcomes(FAST, other=1), outcomes(FAST), 0, "every create served or shed"),
        (outcomes(FAST, ids=200), outcomes(FAST), 1, "nothing lost"),
    ],
    ids=["slow lists", "lists shed", "slow creates", "slow refusals", "timeout", "lost"],
)  # fmt: skip
def test_each_target_fails_on_its_own(
    creates: Outcomes, lists: Outcomes, lost: int, failed: str
) -> None:
    results = judged(creates, lists, lost)
    assert [t for t, met in results.items() if not met] == [failed], results
    assert report("x", "", verdicts(creates, lists, lost)).endswith("shedding.x: FAIL")


def test_nothing_served_or_nothing_shed_is_no_failure_of_that_target() -> None:
    results = judged(outcomes([], shed=[0.003] * 100), outcomes(FAST))
    assert all(results.values()), results
