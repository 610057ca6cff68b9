"""Node monitor (leader-only): heartbeat silence → node offline → tasks migrate; a card
missing from 3 heartbeats → `gpu_lost` and excluded, seen in 2 → `gpu_recovered` (SPEC §3).

Liveness is tracked in memory by the lease holder. A new leader starts every node's clock at
the moment it took over, so a failover never declares the whole fleet dead at once. It runs on
the controller runtime (libs/controller.py); every write goes through the term's writer
(`term.writer`), carrying its fence, the heartbeat handler's too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog
from nats.aio.client import Client
from prometheus_client import Gauge

from libs.controller import Controller, Term
from libs.domain.errors import DomainError, Fenced
from libs.domain.node.decide import probe_card, watch_card
from libs.domain.node.events import (
    CardRestored,
    GpuLost,
    GpuRecovered,
    NodeOffline,
    NodeRegistered,
)
from libs.domain.node.model import CardWatch, Node, NodeStatus
from libs.domain.payload import Payload
from libs.domain.protocol import CommandKind, Heartbeat, NodeCommand
from libs.domain.reasons import ReasonCode
from libs.domain.task import decide as commands
from libs.domain.task.liveness import LivenessWatch, is_dead
from libs.domain.task.model import Task
from libs.domain.task.states import Actor, TaskStatus
from libs.store import nodes as node_rows
from libs.store import tasks as task_rows
from libs.store.eventstore import EventStore
from libs.store.fenced import FencedWriter
from libs.store.projections import NODES

from ..dispatch import STOP_GRACE_S, send, send_all
from .confirm import SWEPT, Confirmations

log = structlog.get_logger(__name__)
S = TaskStatus

NODES_BY_STATE = Gauge("heteroflow_nodes", "Nodes by state", ["state"])
GPUS_BY_STATE = Gauge("heteroflow_gpus", "GPUs by state", ["state"])

# Where each GPU-holding status goes when its node is lost (SPEC §3). Every GPU-holding
# status has an end here, so nothing waits (and counts against quota) on a lost host: a
# sleeping task's paused container went with the node, so it is placed again, as a wake
# with the host offline would do.
ON_NODE_LOSS: dict[TaskStatus, TaskStatus] = {
    S.SCHEDULED: S.PENDING,
    S.STARTING: S.PENDING,
    S.RUNNING: S.PENDING,
    S.SLEEPING: S.PENDING,
    S.WAKING: S.PENDING,
    S.PREEMPTING: S.PENDING,
    S.STOPPING: S.STOPPED,
    S.DRAINING: S.CANCELLED,
}


def migrate_decision(
    node_id: str,
    targets: dict[TaskStatus, TaskStatus] = ON_NODE_LOSS,
    code: ReasonCode = ReasonCode.NODE_LOST,
    why: str = "",
) -> commands.Decide:
    """Move a task of `node_id` to its target for what happened to the node (`targets`)."""
    reason = why or f"node_lost: {node_id}"

    def decide(t: Task) -> list[Any]:
        target = targets.get(t.status)
        if target is None or (t.node_id or "") != node_id:
            return []
        return list(
            commands.decide_transition(
                t,
                target,
                actor=Actor.CONTROLLER,
                expected_status=t.status,
                reason_code=code,
                reason=reason,
                clear_placement=target is S.PENDING,
                error=(why or f"node {node_id} lost") if target is not S.PENDING else None,
            )
        )

    return decide


def unpin_decision(t: Task) -> list[Any]:
    return list(commands.decide_config_update(t, {"requested_node_id": ""}))


class NodeMonitor(Controller):
    name = "node_monitor_tick"

    def __init__(
        self,
        store: EventStore,
        nc: Client,
        *,
        offline_after_s: float = 10.0,
        gone_after_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        tick_s: float = 1.0,
        liveness_floor_s: float = 900.0,
        liveness_stale_s: float = 30.0,
        unconfirmed_after_s: float = 300.0,
        quarantine_probes: int = 3,
        quarantine_probe_interval_s: float = 60.0,
    ) -> None:
        self.store = store
        # Quarantined cards (device faults): probes passed in a row and when the last ran.
        self.quarantine_probes = quarantine_probes
        self.quarantine_probe_interval_s = quarantine_probe_interval_s
        self.probes: dict[tuple[str, str], tuple[int, float]] = {}
        self.nc = nc
        self.offline_after_s = offline_after_s
        self.gone_after_s = gone_after_s
        self.clock = clock
        self.last_seen: dict[str, float] = {}
        self.cards: dict[tuple[str, str], CardWatch] = {}
        self.liveness: dict[str, LivenessWatch] = {}
        self.liveness_floor_s = liveness_floor_s
        self.liveness_stale_s = liveness_stale_s
        self.nodes: dict[str, Node] = {}
        self.since = clock()
        self.interval_s = tick_s
        # The term's writer. The heartbeat handler runs outside the term's task, so its writes
        # need the writer itself; it stays after a term ends: a write still in flight carries
        # the old fence, never none. Without a term (a test driving `tick`) the store's own.
        self.writer: FencedWriter | None = None
        self._fenced: Fenced | None = None  # seen by a heartbeat's write; ends the term
        self.leading = False  # beats arrive on every replica; only the leader acts on them
        self.confirmations = Confirmations(unconfirmed_after_s)
        self.sweep_every_s = min(30.0, max(1.0, unconfirmed_after_s / 4))
        self.next_sweep = 0.0

    async def elected(self, term: Term) -> None:
        self.fence, self._fenced = term.fence, None
        self.writer = term.writer if term.store is not None else None
        # Every node's clock starts now: what a previous term saw may be long stale.
        self.last_seen.clear()
        self.liveness.clear()  # a new term watches from now, like the nodes' clocks
        self.since = self.clock()
        self.confirmations.reset()
        self.next_sweep = self.since + self.sweep_every_s
        await self.refresh()
        self.leading = True

    async def evaluate(self, term: Term) -> None:
        if self._fenced is not None:
            raise self._fenced
        await self.tick()

    async def deposed(self) -> None:
        # The writer stays: a write still in flight carries the old token, never none.
        self.leading = False

    @property
    def writes(self) -> FencedWriter | EventStore:
        return self.writer or self.store

    async def refresh(self) -> None:
        """Bring `nodes` up to the projection, parsing only the rows whose version moved."""
        listed = await node_rows.versions(self.store)
        for gone in [i for i in self.nodes if i not in listed]:
            del self.nodes[gone]
        stale = [i for i, v in listed.items() if i not in self.nodes or self.nodes[i].version != v]
        if stale:
            for node in await node_rows.by_ids(self.store, stale):
                self.nodes[node.id] = node
        states = {s.value: 0 for s in NodeStatus}
        lost = total = 0
        for n in self.nodes.values():
            states[n.status.value] += 1
            total += len(n.inventory.gpus)
            lost += len(n.excluded_gpus)
        for state, count in states.items():
            NODES_BY_STATE.labels(state).set(count)
        GPUS_BY_STATE.labels("healthy").set(total - lost)
        GPUS_BY_STATE.labels("lost").set(lost)

    async def heartbeat(self, hb: Heartbeat) -> None:
        """The heartbeat subscriber's handler (see the scheduler's routes)."""
        if not self.leading:
            return
        try:
            await self.on_heartbeat(hb)
        except Fenced as exc:
            self._fenced = exc  # the next evaluation ends the term
        except Exception:
            log.exception("heartbeat_rejected", node_id=hb.node_id)

    async def on_heartbeat(self, hb: Heartbeat) -> None:
        now = self.clock()
        self.last_seen[hb.node_id] = now
        self.confirmations.confirm(hb.node_id, hb.tasks, now)
        for task_id, evidence in hb.liveness.items():
            lw = self.liveness.get(task_id)
            if lw is None or lw.node_id != hb.node_id:
                lw = LivenessWatch(hb.node_id, now, now, evidence)
                self.liveness[task_id] = lw
            lw.observe(evidence, now)
        node = self.nodes.get(hb.node_id)
        if node is None:
            return  # not registered yet; its registration brings it in
        if node.status is not NodeStatus.ONLINE:
            # Back after an outage without a restart: online again with what it had, and
            # what it still runs for tasks placed elsewhere meanwhile is told to stop.
            await self._append(node.id, [NodeRegistered(node_id=node.id, inventory=node.inventory)])
            await self.stop_strays(node.id, hb.tasks)
            return
        visible = set(hb.visible_gpus)
        events: list[Payload] = []
        for card in node.inventory.gpus:
            key = (node.id, card.id)
            excluded = card.id in node.excluded_gpus
            seen = card.id in visible
            known = self.cards.get(key)
            if seen and not excluded and (known is None or known.missed == 0):
                # A healthy card seen again changes nothing: its sightings count only once
                # it is excluded, and every miss resets them (watch_card).
                continue
            watch, crossing = watch_card(known or CardWatch(), seen, excluded)
            self.cards[key] = watch
            if crossing == "lost":
                events.append(
                    GpuLost(node_id=node.id, gpu_id=card.id, missed_heartbeats=watch.missed)
                )
            elif crossing == "recovered":
                events.append(GpuRecovered(node_id=node.id, gpu_id=card.id, seen_heartbeats=2))
        events += self.probe_quarantined(node, visible, now)
        if events:
            await self._append(node.id, events)
            log.warning(
                "gpu_state_changed",
                node_id=node.id,
                changes=[(e.type, getattr(e, "gpu_id", "")) for e in events],
            )

    def probe_quarantined(self, node: Node, visible: set[str], now: float) -> list[Payload]:
        """One health probe per quarantined card per probe interval: the card is on the bus
        (the heartbeat shows it) and not lost; enough passes in a row bring it back."""
        out: list[Payload] = []
        for q in node.quarantined_gpus:
            key = (node.id, q.gpu_id)
            passed, last = self.probes.get(key, (0, now))
            if key in self.probes and now - last < self.quarantine_probe_interval_s:
                continue
            if key not in self.probes:
                self.probes[key] = (0, now)  # the first probe one interval after the fault
                continue
            healthy = q.gpu_id not in node.excluded_gpus
            passed, back = probe_card(passed, q.gpu_id in visible, healthy, self.quarantine_probes)
            self.probes[key] = (passed, now)
            if back:
                del self.probes[key]
                out.append(
                    CardRestored(node_id=node.id, gpu_id=q.gpu_id, by="probe", probes_passed=passed)
                )
        return out

    async def _append(self, node_id: str, events: list[Payload]) -> None:
        node = await self.writes.execute_aggregate(NODES, node_id, lambda _n: events)
        if node is not None:
            self.nodes[node_id] = node

    async def tick(self) -> None:
        await self.refresh()
        now = self.clock()
        for node in list(self.nodes.values()):
            silent = now - self.last_seen.get(node.id, self.since)
            if node.status is NodeStatus.ONLINE and silent > self.offline_after_s:
                await self.node_lost(node, silent)
            elif node.status is NodeStatus.OFFLINE and silent > self.gone_after_s:
                await self.node_gone(node, silent)
        await self.strand_check()
        await self.liveness_floor(now)
        if now >= self.next_sweep:
            self.next_sweep = now + self.sweep_every_s
            await self.sweep(now)

    async def liveness_floor(self, now: float) -> None:
        """Declare dead the running inference tasks past the floor with ≥2 death signals."""
        for task_id, watch in list(self.liveness.items()):
            if now - watch.last_evidence_at > self.liveness_floor_s + self.liveness_stale_s:
                del self.liveness[task_id]  # ended or moved long ago: stop remembering it
                continue
            signals = is_dead(watch, now, self.liveness_floor_s, self.liveness_stale_s)
            if signals:
                del self.liveness[task_id]
                await self.declare_dead(task_id, watch.node_id, signals)

    async def declare_dead(self, task_id: str, node_id: str, signals: list[str]) -> None:
        """Fail it (its group or the retry engine recovers it), then stop what is left."""
        text = f"no positive liveness for {self.liveness_floor_s:g}s: {'; '.join(signals)}"

        def decide(t: Task) -> list[Any]:
            if t.status is not S.RUNNING or t.node_id != node_id:
                return []
            return list(
                commands.decide_transition(
                    t,
                    S.FAILED,
                    actor=Actor.CONTROLLER,
                    expected_status=S.RUNNING,
                    reason_code=ReasonCode.LIVENESS_LOST,
                    error=f"LivenessLost: {text}",
                )
            )

        done, _ = await self.writes.execute_batch({task_id: decide})
        task = done.get(task_id)
        if task is None or task.status is not S.FAILED:
            return
        log.warning("task_declared_dead", task_id=task_id, node_id=node_id, signals=signals)
        cmd = NodeCommand(
            kind=CommandKind.STOP,
            node_id=node_id,
            task_id=task_id,
            attempt=task.attempt,
            status=S.FAILED,
            task_version=task.version,
            grace_s=STOP_GRACE_S,
        )
        try:
            await send(self.nc.jetstream(), cmd)
        except Exception:  # the task is failed either way; its container ends with the node
            log.exception("dead_task_stop_not_sent", task_id=task_id)

    async def sweep(self, now: float) -> None:
        """Resolve the tasks their node has not confirmed for `unconfirmed_after_s`."""
        rows = await task_rows.placements(self.store, SWEPT)
        placed = [(task_id, node_id, status) for task_id, node_id, status, _ in rows]
        attempts = {row[0]: row[3] for row in rows}
        strays = self.confirmations.strays(placed, now, within_s=2 * self.sweep_every_s)
        await self.send_stops([(node, task, attempts[task]) for task, node in strays])
        late = self.confirmations.overdue(placed, now)
        after = self.confirmations.after_s
        for task_id, node_id, status in late:
            why = f"node {node_id or '(none)'} has not confirmed it for {after:.0f}s"
            decide = migrate_decision(node_id, ON_NODE_LOSS, ReasonCode.TASK_UNCONFIRMED, why)
            try:
                await self.writes.execute(task_id, decide, metadata={"node_id": node_id})
            except DomainError:
                continue  # it moved on meanwhile (or is deleted): the next sweep sees it
            log.warning("task_unconfirmed", task_id=task_id, node_id=node_id, status=status.value)

    async def stop_strays(self, node_id: str, task_ids: Sequence[str]) -> None:
        """Stop commands to `node_id` for the tasks it lists that are placed elsewhere now."""
        if not task_ids:
            return
        placed = await task_rows.nodes_of(self.store, task_ids)
        # Only tasks placed on another node: a pending one may yet come back here, and is
        # stopped by the sweep if it is placed elsewhere instead.
        await self.send_stops(
            [
                (node_id, task_id, attempt)
                for task_id, (where, attempt) in placed.items()
                if where not in ("", node_id)
            ]
        )

    async def send_stops(self, strays: Sequence[tuple[str, str, int]]) -> None:
        """Stop commands for (node, task, attempt): a container a node runs for a task that
        is now another node's."""
        if not strays:
            return
        stops = [
            NodeCommand(
                kind=CommandKind.STOP,
                node_id=node_id,
                task_id=task_id,
                attempt=attempt,
                status=TaskStatus.STOPPING,
                grace_s=5.0,
            )
            for node_id, task_id, attempt in strays
        ]
        failed = await send_all(self.nc.jetstream(), stops)
        log.warning(
            "stray_containers_stopped",
            strays=[(c.node_id, c.task_id) for c in stops],
            failed=sum(1 for f in failed if f),
        )

    async def node_lost(self, node: Node, silent: float) -> None:
        offline = NodeOffline(
            node_id=node.id,
            silent_seconds=silent,
            reason_code=ReasonCode.NODE_LOST,
            reason=f"no heartbeat for {silent:.0f}s",
        )
        await self._append(node.id, [offline])
        ids = await task_rows.ids_on_node(self.store, node.id, ON_NODE_LOSS)
        decide = migrate_decision(node.id)
        done, refused = await self.writes.execute_batch(
            dict.fromkeys(ids, decide), metadata={"node_id": node.id}
        )
        log.warning(
            "node_offline",
            node_id=node.id,
            silent_s=round(silent, 1),
            migrated=len(done),
            refused=len(refused),
        )

    async def strand_check(self) -> None:
        """End the tasks that reached a GPU-holding status on a node already offline (a group
        wake or a stop after the loss, a write racing `node_lost`): without this they would
        wait for a node that may never return."""
        lost = [n.id for n in self.nodes.values() if n.status is not NodeStatus.ONLINE]
        if not lost:
            return
        stranded = await task_rows.on_nodes(self.store, lost, ON_NODE_LOSS)
        if not stranded:
            return
        why = {n: f"node_lost: {n} is offline" for n in set(stranded.values())}
        decides = {t: migrate_decision(n, why=why[n]) for t, n in stranded.items()}
        done, _ = await self.writes.execute_batch(decides)
        log.warning("stranded_tasks_ended", tasks=sorted(done), nodes=sorted(why))

    async def node_gone(self, node: Node, silent: float) -> None:
        """Confirmed gone for good: only now do pinned tasks lose their pin."""
        gone = NodeOffline(
            node_id=node.id,
            silent_seconds=silent,
            gone=True,
            reason_code=ReasonCode.NODE_GONE,
            reason=f"no heartbeat for {silent:.0f}s",
        )
        await self._append(node.id, [gone])
        ids = await task_rows.ids_pinned_pending(self.store, node.id)
        done, _ = await self.writes.execute_batch(dict.fromkeys(ids, unpin_decision))
        log.warning("node_gone", node_id=node.id, unpinned=len(done))
