"""Node monitor (leader-only): heartbeat silence → node offline → tasks migrate; a card
missing from 3 heartbeats → `gpu_lost` and excluded, seen in 2 → `gpu_recovered` (SPEC §3).

Liveness is tracked in memory by the lease holder. A new leader starts every node's clock at
the moment it took over, so a failover never declares the whole fleet dead at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import structlog
from nats.aio.client import Client
from prometheus_client import Gauge

from libs.domain import commands
from libs.domain.events import Payload
from libs.domain.node import (
    CardWatch,
    GpuLost,
    GpuRecovered,
    Node,
    NodeOffline,
    NodeRegistered,
    NodeStatus,
    watch_card,
)
from libs.domain.protocol import Heartbeat
from libs.domain.states import Actor, TaskStatus
from libs.domain.task import Task
from libs.periodic import periodic
from libs.store.eventstore import EventStore
from libs.store.projections import NODES

log = structlog.get_logger(__name__)
S = TaskStatus

NODES_BY_STATE = Gauge("heteroflow_nodes", "Nodes by state", ["state"])
GPUS_BY_STATE = Gauge("heteroflow_gpus", "GPUs by state", ["state"])

# Where each GPU-holding status goes when its node is lost (SPEC §3).
ON_NODE_LOSS: dict[TaskStatus, TaskStatus] = {
    S.SCHEDULED: S.PENDING,
    S.STARTING: S.PENDING,
    S.RUNNING: S.PENDING,
    S.WAKING: S.PENDING,
    S.PREEMPTING: S.PENDING,
    S.STOPPING: S.STOPPED,
    S.DRAINING: S.CANCELLED,
}


def migrate_decision(node_id: str) -> commands.Decide:
    def decide(t: Task) -> list[Any]:
        target = ON_NODE_LOSS.get(t.status)
        if target is None or t.node_id != node_id:
            return []
        return list(
            commands.decide_transition(
                t,
                target,
                actor=Actor.CONTROLLER,
                expected_status=t.status,
                reason=f"node_lost: {node_id}",
                clear_placement=target is S.PENDING,
                error=f"node {node_id} lost" if target is not S.PENDING else None,
            )
        )

    return decide


def unpin_decision(t: Task) -> list[Any]:
    return list(commands.decide_config_update(t, {"requested_node_id": ""}))


class NodeMonitor:
    def __init__(
        self,
        store: EventStore,
        nc: Client,
        *,
        offline_after_s: float = 10.0,
        gone_after_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.nc = nc
        self.offline_after_s = offline_after_s
        self.gone_after_s = gone_after_s
        self.clock = clock
        self.last_seen: dict[str, float] = {}
        self.cards: dict[tuple[str, str], CardWatch] = {}
        self.nodes: dict[str, Node] = {}
        self.since = clock()
        self.leading = False  # beats arrive on every replica; only the leader acts on them

    async def run(self, stop: asyncio.Event, tick_s: float = 1.0) -> None:
        self.since = self.clock()
        await self.refresh()
        self.leading = True
        try:
            await periodic("node_monitor_tick", self.tick, stop, tick_s)
        finally:
            self.leading = False

    async def refresh(self) -> None:
        """Bring `nodes` up to the projection, parsing only the rows whose version moved."""
        listed = {
            r["id"]: r["version"] for r in await self.store.fetch("SELECT id, version FROM nodes")
        }
        for gone in [i for i in self.nodes if i not in listed]:
            del self.nodes[gone]
        stale = [i for i, v in listed.items() if i not in self.nodes or self.nodes[i].version != v]
        if stale:
            rows = await self.store.fetch("SELECT doc FROM nodes WHERE id = ANY(%s)", [stale])
            for r in rows:
                node = Node.model_validate(r["doc"])
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
        except Exception:
            log.exception("heartbeat_rejected", node_id=hb.node_id)

    async def on_heartbeat(self, hb: Heartbeat) -> None:
        self.last_seen[hb.node_id] = self.clock()
        node = self.nodes.get(hb.node_id)
        if node is None:
            return  # not registered yet; its registration brings it in
        if node.status is not NodeStatus.ONLINE:
            # Back after an outage without a restart: online again with what it had.
            await self._append(node.id, [NodeRegistered(node_id=node.id, inventory=node.inventory)])
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
        if events:
            await self._append(node.id, events)
            log.warning(
                "gpu_state_changed",
                node_id=node.id,
                changes=[(e.type, getattr(e, "gpu_id", "")) for e in events],
            )

    async def _append(self, node_id: str, events: list[Payload]) -> None:
        node = await self.store.execute_aggregate(NODES, node_id, lambda _n: events)
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

    async def node_lost(self, node: Node, silent: float) -> None:
        await self._append(node.id, [NodeOffline(node_id=node.id, silent_seconds=silent)])
        rows = await self.store.fetch(
            "SELECT id FROM tasks WHERE node_id = %s AND status = ANY(%s)",
            [node.id, [s.value for s in ON_NODE_LOSS]],
        )
        decide = migrate_decision(node.id)
        done, refused = await self.store.execute_batch(
            {r["id"]: decide for r in rows}, metadata={"node_id": node.id}
        )
        log.warning(
            "node_offline",
            node_id=node.id,
            silent_s=round(silent, 1),
            migrated=len(done),
            refused=len(refused),
        )

    async def node_gone(self, node: Node, silent: float) -> None:
        """Confirmed gone for good: only now do pinned tasks lose their pin."""
        await self._append(
            node.id, [NodeOffline(node_id=node.id, silent_seconds=silent, gone=True)]
        )
        rows = await self.store.fetch(
            "SELECT id FROM tasks WHERE doc->'spec'->>'requested_node_id' = %s"
            " AND status = 'pending' AND deleted_at IS NULL",
            [node.id],
        )
        done, _ = await self.store.execute_batch({r["id"]: unpin_decision for r in rows})
        log.warning("node_gone", node_id=node.id, unpinned=len(done))
