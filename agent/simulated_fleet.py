"""A simulated fleet: many nodes in one process, each acting like an agent that runs nothing.

For benchmarks and soak tests of the control plane at fleet scale, where a thousand `Agent`
objects (a durable consumer, a heartbeat loop and a runtime each) would cost more CPU than the
control plane under test. Instead:

* registration: one `Registration` per node on `hf.node.<id>.report`, as an agent sends it;
* heartbeats: every node's beat in one burst per interval (core NATS, as an agent's), listing
  all its cards as visible, so no card is ever declared lost;
* commands: ONE durable consumer on `hf.node.*.cmd` serves every node; `replies` turns each
  command into the reports an agent would publish (START: STARTING then RUNNING; STOP: an exit;
  PAUSE/RESUME: PAUSED/RESUMED). Nothing runs, so a task stays `running` until stopped, or
until `finish()` ends every running task with exit code 0 (a benchmark freeing the fleet).

`silence(node_id)` makes one node fall silent (no beats, commands dropped), like a machine
that lost power: what the node monitor must notice. `serve` runs a fleet on its own (in a
child process, say, as nodes are other machines) steered by requests on a control subject.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from libs.bus import broker
from libs.bus.nats import connect
from libs.bus.subjects import NODE_PREFIX, NODE_STREAM, node_heartbeat_subject, node_report_subject
from libs.domain.node.model import GpuCard, NodeInventory
from libs.domain.protocol import (
    AgentReport,
    CommandKind,
    Fact,
    Heartbeat,
    NodeCommand,
    Registration,
)
from libs.domain.task.states import TaskStatus
from libs.periodic import periodic

log = structlog.get_logger(__name__)
S = TaskStatus


@dataclass(frozen=True)
class NodeKind:
    """One kind of machine: `count` cards of one model."""

    vendor: str
    model: str
    vram_mb: int
    count: int
    mig_capable: bool = False


# A mixed fleet, in equal numbers: three NVIDIA models, AMD and Huawei accelerators.
DEFAULT_KINDS: tuple[NodeKind, ...] = (
    NodeKind("nvidia", "A100-80GB", 81_920, 8, mig_capable=True),
    NodeKind("nvidia", "H100-80GB", 81_920, 8, mig_capable=True),
    NodeKind("nvidia", "L4", 23_034, 4),
    NodeKind("amd", "MI300X", 196_608, 8),
    NodeKind("huawei", "Ascend910B", 65_536, 8),
)


def fleet_inventories(
    n: int,
    kinds: Sequence[NodeKind] = DEFAULT_KINDS,
    *,
    prefix: str = "sim",
    memory_mb: int = 1_048_576,
    cpu_cores: float = 128.0,
) -> list[tuple[str, NodeInventory]]:
    """`n` nodes `<prefix>-00000`, ..., the kinds taken in turn; card ids are unique."""
    out: list[tuple[str, NodeInventory]] = []
    width = max(5, len(str(max(n - 1, 0))))
    for i in range(n):
        kind = kinds[i % len(kinds)]
        node_id = f"{prefix}-{i:0{width}d}"
        gpus = tuple(
            GpuCard(
                id=f"{node_id}-gpu{j}",
                index=j,
                vendor=kind.vendor,
                model=kind.model,
                vram_mb=kind.vram_mb,
                mig_capable=kind.mig_capable,
            )
            for j in range(kind.count)
        )
        inventory = NodeInventory(
            hostname=node_id,
            memory_mb=memory_mb,
            cpu_cores=cpu_cores,
            labels={"fleet": prefix},
            gpus=gpus,
            runtime="simulated",
        )
        out.append((node_id, inventory))
    return out


def replies(cmd: NodeCommand, at: datetime) -> list[AgentReport]:
    """The reports an agent sends for `cmd` when nothing can go wrong."""

    def report(fact: Fact, expected: TaskStatus, **extra: object) -> AgentReport:
        return AgentReport.model_validate(
            {
                "node_id": cmd.node_id,
                "task_id": cmd.task_id,
                "attempt": cmd.attempt,
                "fact": fact,
                "expected_status": expected,
                "at": at,
                **extra,
            }
        )

    if cmd.kind is CommandKind.START:
        container = f"sim-{cmd.task_id}-{cmd.attempt}"
        return [
            report(Fact.STARTING, S.SCHEDULED),
            report(Fact.RUNNING, S.STARTING, container_id=container),
        ]
    if cmd.kind is CommandKind.STOP:
        return [report(Fact.EXITED, cmd.status, exit_code=0)]
    if cmd.kind is CommandKind.PAUSE:
        return [report(Fact.PAUSED, S.SLEEPING)]
    return [report(Fact.RESUMED, S.WAKING)]


def finished(node_id: str, task_id: str, attempt: int, at: datetime) -> AgentReport:
    """The report of a running task whose process ended by itself with exit code 0."""
    return AgentReport.model_validate(
        {
            "node_id": node_id,
            "task_id": task_id,
            "attempt": attempt,
            "fact": Fact.EXITED,
            "expected_status": S.RUNNING,
            "at": at,
            "exit_code": 0,
        }
    )


@dataclass
class SimulatedFleet:
    nc: Client
    js: JetStreamContext
    nodes: Sequence[tuple[str, NodeInventory]]
    heartbeat_interval_s: float = 1.0
    durable: str = "sim-fleet"
    silenced: set[str] = field(default_factory=set)
    running: dict[str, set[str]] = field(default_factory=dict)  # node -> task ids
    attempts: dict[str, int] = field(default_factory=dict)  # task id -> attempt it runs
    commands: int = 0
    beats: int = 0

    async def register(self) -> None:
        """Every node's registration, pipelined, each acknowledged by JetStream."""
        acks = []
        for node_id, inventory in self.nodes:
            reg = Registration(node_id=node_id, inventory=inventory, at=_now())
            acks.append(
                await self.js.publish_async(
                    node_report_subject(node_id), reg.model_dump_json().encode()
                )
            )
        await asyncio.gather(*acks)

    def silence(self, node_id: str) -> None:
        self.silenced.add(node_id)

    async def finish(self) -> int:
        """Every running task on a live node exits 0, as finished work does; reports pipelined,
        each acknowledged by JetStream. Returns how many tasks ended."""
        acks = []
        at = _now()
        for node_id, tasks in self.running.items():
            if node_id in self.silenced:
                continue
            for task_id in sorted(tasks):
                rep = finished(node_id, task_id, self.attempts.pop(task_id, 0), at)
                subject = node_report_subject(node_id)
                acks.append(await self.js.publish_async(subject, rep.model_dump_json().encode()))
            tasks.clear()
        await asyncio.gather(*acks)
        return len(acks)

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.gather(
            self._heartbeats(stop),
            broker.serve(self.nc, [self.routes()], stop),
        )

    def routes(self) -> broker.Routes:
        r = broker.Routes("simulated-fleet")
        r.durable(
            NodeCommand,
            self.on_command,
            stream=NODE_STREAM,
            durable=self.durable,
            subject=f"{NODE_PREFIX}.{{node_id}}.cmd",
            description="Commands for every simulated node.",
            deliver_new=True,
        )
        return r

    async def beat(self) -> None:
        """One heartbeat from every node that is not silenced."""
        self.beats += 1
        at = _now()
        for node_id, inventory in self.nodes:
            if node_id in self.silenced:
                continue
            hb = Heartbeat(
                node_id=node_id,
                seq=self.beats,
                visible_gpus=[g.id for g in inventory.gpus],
                tasks=sorted(self.running.get(node_id, ())),
                at=at,
            )
            await self.nc.publish(node_heartbeat_subject(node_id), hb.model_dump_json().encode())
        await self.nc.flush()

    async def _heartbeats(self, stop: asyncio.Event) -> None:
        await periodic("fleet_heartbeat", self.beat, stop, self.heartbeat_interval_s)

    async def on_command(self, cmd: NodeCommand) -> None:
        if cmd.node_id in self.silenced:
            return  # a dead machine answers nothing
        self.commands += 1
        tasks = self.running.setdefault(cmd.node_id, set())
        if cmd.kind is CommandKind.START:
            tasks.add(cmd.task_id)
            self.attempts[cmd.task_id] = cmd.attempt
        elif cmd.kind is CommandKind.STOP:
            tasks.discard(cmd.task_id)
            self.attempts.pop(cmd.task_id, None)
        for rep in replies(cmd, _now()):
            await self.js.publish(node_report_subject(cmd.node_id), rep.model_dump_json().encode())


async def serve(
    nats_url: str,
    nodes: Sequence[tuple[str, NodeInventory]],
    control_subject: str,
    *,
    heartbeat_interval_s: float = 1.0,
    durable: str = "sim-fleet",
) -> None:
    """Run a fleet until told to stop. Requests on `control_subject` (JSON, answered with
    `{"ok": true}` once done): `{"op": "register"}`, `{"op": "silence", "node_id": ...}`,
    `{"op": "finish"}`, `{"op": "stop"}`."""
    nc = await connect(nats_url, "simulated-fleet")
    stop = asyncio.Event()
    fleet = SimulatedFleet(
        nc, nc.jetstream(), nodes, heartbeat_interval_s=heartbeat_interval_s, durable=durable
    )

    async def on_control(msg: Msg) -> None:
        req = json.loads(msg.data)
        if req["op"] == "register":
            await fleet.register()
        elif req["op"] == "silence":
            fleet.silence(str(req["node_id"]))
        elif req["op"] == "finish":
            await fleet.finish()
        elif req["op"] == "stop":
            stop.set()
        await msg.respond(json.dumps({"ok": True}).encode())

    sub = await nc.subscribe(control_subject, cb=on_control)
    try:
        await fleet.run(stop)
    finally:
        await sub.unsubscribe()
        await nc.drain()


def _now() -> datetime:
    return datetime.now(UTC)
