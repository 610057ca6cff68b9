"""At most one run per attempt, whatever the runtime: a START for an attempt the agent already
ran is answered from its durable record (agent/attempts.py), not run again, even once the
attempt's container or task directory is gone (retention keeping none here) and the agent has
restarted. Real NATS (the reports are read off the bus), real runtimes; the runtime's `start`
is counted, and the process runtime's runs are also counted in a file each run appends to.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg

from agent.inventory import Inventory
from agent.runtimes import create_runtime
from agent.runtimes.base import Handle, RunSpec, Runtime
from agent.service import Agent, AgentSettings
from libs.bus.nats import connect, ensure_streams
from libs.bus.subjects import node_report_subject
from libs.domain.protocol import CommandKind, NodeCommand, TaskRunSpec
from libs.domain.task.model import TaskSpec
from libs.domain.task.states import TaskStatus
from tests.wait import wait_until_async

from .conftest import requires_docker

pytestmark = pytest.mark.integration

WITHIN_S = 60.0


class Counted:
    """The runtime under test, its `start` calls counted (what 'ran' means for every one)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.starts: list[tuple[str, int]] = []
        original = runtime.start

        async def start(spec: RunSpec) -> Handle:
            self.starts.append((spec.task_id, spec.attempt))
            return await original(spec)

        runtime.start = start  # type: ignore[method-assign]


def make_runtime(kind: str, state: Path, node_id: str) -> Runtime:
    options: dict[str, Any] = {"owner": node_id, "installation": f"test-{node_id}"}
    return create_runtime(
        kind,
        state_dir=state,
        docker_options=options,
        simulated_options={"durations": 0.2, "node_id": node_id},
    )


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Any]:
    nc = await connect(nats_url, "test-attempts")
    await ensure_streams(nc.jetstream())
    yield nc
    await nc.close()


RUNTIMES = [
    pytest.param("process", id="process"),
    pytest.param("simulated", id="simulated"),
    pytest.param("docker", id="docker", marks=requires_docker),
]


@pytest.mark.parametrize("kind", RUNTIMES)
async def test_a_start_for_an_ended_attempt_is_answered_from_the_record(
    kind: str, bus: Any, tmp_path: Path
) -> None:
    node_id = f"att-{uuid.uuid4().hex[:8]}"
    runs = tmp_path / "runs.log"
    reports: list[dict[str, Any]] = []

    async def heard(msg: Msg) -> None:
        body = json.loads(msg.data)
        if body.get("kind") == "task":
            reports.append(body)

    await bus.subscribe(node_report_subject(node_id), cb=heard)
    settings = AgentSettings(
        node_id=node_id,
        state_dir=tmp_path / "state",
        finished_keep=0,  # nothing of an ended attempt is left in the runtime
        detect_nvidia=False,
        home=tmp_path / "home",
    )
    # A container cannot write the host's file: there the runtime's starts are the count.
    command = "echo ran" if kind == "docker" else f"echo $HETEROFLOW_TASK_ID >> {runs}"
    spec = TaskSpec(name="once", image="busybox:latest", command=command)
    start = NodeCommand(
        kind=CommandKind.START,
        node_id=node_id,
        task_id=f"t-{uuid.uuid4().hex[:8]}",
        attempt=0,
        status=TaskStatus.SCHEDULED,
        run=TaskRunSpec(spec=spec, tenant_id="default"),
    )

    def exits() -> list[dict[str, Any]]:
        return [r for r in reports if r["fact"] == "exited" and r["task_id"] == start.task_id]

    async def agent_life(body: Callable[[Agent, Counted], Any]) -> Counted:
        """One agent process's life on the state directory: runs `body`, then stops."""
        counted = Counted(make_runtime(kind, tmp_path / "state", node_id))
        inventory = Inventory(node_id=node_id, hostname="h", memory_mb=65536, cpu_cores=8)
        agent = Agent(settings, bus, bus.jetstream(), counted.runtime, inventory)
        stop = asyncio.Event()
        reporter = asyncio.create_task(agent.reporter.run(stop))
        try:
            await body(agent, counted)
        finally:
            stop.set()
            await reporter
            await counted.runtime.close()
        return counted

    async def first(agent: Agent, counted: Counted) -> None:
        await agent.start(start)
        await wait_until_async(lambda: len(exits()) == 1, WITHIN_S, message="its exit reported")
        await wait_until_async(
            lambda: not agent.tracked and len(agent.retention) == 0, WITHIN_S, message="removed"
        )

        async def gone() -> bool:
            return not await counted.runtime.list_managed()

        await wait_until_async(gone, WITHIN_S, message="nothing of it left in the runtime")
        await agent.start(start)  # redelivered: the agent tracks it no more, nothing is left
        await wait_until_async(lambda: len(exits()) == 2, WITHIN_S, message="answered")

    async def restarted(agent: Agent, counted: Counted) -> None:
        await agent.start(start)  # redelivered to the agent that came back
        await wait_until_async(lambda: len(exits()) == 3, WITHIN_S, message="answered again")

    assert (await agent_life(first)).starts == [(start.task_id, 0)], "ran twice"
    assert (await agent_life(restarted)).starts == [], "ran again after a restart"
    assert {(r["exit_code"], r["expected_status"], r["attempt"]) for r in exits()} == {
        (0, "running", 0)
    }, exits()
    if kind == "process":
        assert runs.read_text().split() == [start.task_id]


async def test_a_start_recorded_but_gone_from_the_runtime_is_reported_lost(
    bus: Any, tmp_path: Path
) -> None:
    """Recorded as started, never seen ending, and not in the runtime (the agent died between
    the record and the start): its outcome is unknown, so it is reported lost, not run."""
    node_id = f"att-{uuid.uuid4().hex[:8]}"
    reports: list[dict[str, Any]] = []

    async def heard(msg: Msg) -> None:
        reports.append(json.loads(msg.data))

    await bus.subscribe(node_report_subject(node_id), cb=heard)
    settings = AgentSettings(
        node_id=node_id, state_dir=tmp_path / "state", detect_nvidia=False, home=tmp_path
    )
    counted = Counted(make_runtime("process", tmp_path / "state", node_id))
    inventory = Inventory(node_id=node_id, hostname="h", memory_mb=65536, cpu_cores=8)
    agent = Agent(settings, bus, bus.jetstream(), counted.runtime, inventory)
    agent.attempts.started("t-lost", 1)
    stop = asyncio.Event()
    reporter = asyncio.create_task(agent.reporter.run(stop))
    cmd = NodeCommand(
        kind=CommandKind.START,
        node_id=node_id,
        task_id="t-lost",
        attempt=1,
        status=TaskStatus.SCHEDULED,
        run=TaskRunSpec(spec=TaskSpec(name="lost", command="true")),
    )
    try:
        await agent.start(cmd)
        await wait_until_async(lambda: bool(reports), WITHIN_S, message="a report")
    finally:
        stop.set()
        await reporter
        await counted.runtime.close()
    assert counted.starts == []
    ((lost,),) = [[r for r in reports if r.get("kind") == "task"]]
    assert (lost["fact"], lost["attempt"], lost["error_kind"]) == (
        "lost",
        1,
        "ContainerRuntimeError",
    )
