"""The deploy suite's rows: the multi-container numbers are read against `up`'s of the same
run (their ratio), and a deployment that could not run says why instead of a number."""

from __future__ import annotations

import math

from bench.deploy import Measured, rows, task_body


def test_compose_rows_name_the_up_rows_as_their_floor() -> None:
    up = rows(
        "up",
        Measured(
            latencies=[0.1] * 99 + [0.3], submitted=100, burst=50, placed=50, burst_seconds=2.0
        ),
        None,
    )
    compose = rows(
        "compose",
        Measured(
            latencies=[0.2] * 100,
            submitted=100,
            burst=50,
            placed=50,
            burst_seconds=5.0,
            create_seconds=4.5,
        ),
        up,
    )
    assert [r.metric for r in up] == [
        "deploy.up.placements",
        "deploy.up.submit_to_running_p50",
        "deploy.up.submit_to_running_p99",
    ]
    assert [r.value for r in up] == [25.0, 100.0, 300.0]
    assert [r.floor for r in compose] == [r.metric for r in up]
    assert [round(r.ratio or 0, 2) for r in compose] == [0.4, 2.0, 0.67]
    assert compose[0].note == "50 of 50 placed in 5.00 s (their creates 4.50 s); 100 of 100 running"


def test_a_deployment_that_could_not_run_has_no_number_and_says_why() -> None:
    (placements, p50, p99) = rows("compose", Measured(), None, "not measured: no Docker")
    assert all(math.isnan(r.value) for r in (placements, p50, p99))
    assert placements.note == "not measured: no Docker"


def test_refused_creates_are_counted_in_the_note() -> None:
    m = Measured(latencies=[0.1], submitted=1, burst=1, placed=1, burst_seconds=1.0)
    m.errors["429"] += 2
    assert rows("up", m, None)[0].note.endswith("refused: {'429': 2}")


def test_simulated_tasks_run_a_second_and_docker_tasks_sleep_one() -> None:
    assert task_body("simulated", 1)["labels"] == {"sim.duration_s": "1"}
    assert task_body("docker", 1)["command"] == "sleep 1"
    assert "labels" not in task_body("docker", 1)
