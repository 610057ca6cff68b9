"""An index over one snapshot's nodes, so a task is not checked against every node.

Nodes with the same online state, runtime, pools and cards (vendor, model, VRAM, lost or not)
form a class. The static stages (stages.py: online, pool, runtime, GPU type, VRAM) give
every node of a class the same answer, so they run once per class and task shape instead of
once per node; pin and exclusion are per node and cheap. What depends on usage is indexed by
the ledger (ledger.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .feasibility import NodeUsage
from .model import Allocation, Gpu, Node, PendingTask, gpu_matches
from .reasons import Reason
from .stages import STATIC_STAGES

CardKey = tuple[str, str, int, bool]
# What the static stages read from a task; two tasks with the same key get the same answers.
StaticKey = tuple[str, bool, int, int, int, str, frozenset[str]]
_NO_USAGE = NodeUsage()  # the static stages never read usage


def hardware_key(node: Node) -> tuple[CardKey, ...]:
    return tuple(sorted((g.vendor, g.model, g.vram_mb, g.excluded) for g in node.gpus))


def static_key(task: PendingTask) -> StaticKey:
    req = task.requirement
    frac_vram = req.gpu_memory_mb if req.is_fractional else 0
    return (
        req.gpu_type,
        req.needs_gpu,
        req.gpu_count,
        frac_vram,
        task.required_min_vram_mb,
        req.runtime,
        task.pools,
    )


@dataclass(frozen=True, slots=True)
class NodeClass:
    """Nodes that the static stages cannot tell apart. `positions` index `ClusterIndex.nodes`."""

    id: int
    online: bool
    positions: tuple[int, ...]  # ascending, i.e. by node id
    representative: Node  # the first node by id

    @property
    def gpus(self) -> tuple[Gpu, ...]:
        return self.representative.gpus


class ClusterIndex:
    """Nodes sorted by id, grouped into classes; static answers memoised per task shape."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes: tuple[Node, ...] = tuple(sorted(nodes, key=lambda n: n.id))
        self.position: dict[str, int] = {n.id: i for i, n in enumerate(self.nodes)}
        groups: dict[tuple[bool, str, frozenset[str], tuple[CardKey, ...]], list[int]] = {}
        for i, node in enumerate(self.nodes):
            key = (node.online, node.runtime, node.pools, hardware_key(node))
            groups.setdefault(key, []).append(i)
        # Insertion order: classes are ordered by their first node id, so walks are replayable.
        self.classes: tuple[NodeClass, ...] = tuple(
            NodeClass(k, online, tuple(pos), self.nodes[pos[0]])
            for k, ((online, _, _, _), pos) in enumerate(groups.items())
        )
        self.class_of: list[int] = [0] * len(self.nodes)
        for cls in self.classes:
            for pos in cls.positions:
                self.class_of[pos] = cls.id
        self.max_cards: int = max((len(n.gpus) for n in self.nodes), default=0)
        # Cards not lost, per node: the free whole cards of an idle node.
        self.healthy: list[int] = [sum(not g.excluded for g in n.gpus) for n in self.nodes]
        # usage_of and the bucket key per node, by the allocations they were computed from
        # (ledger.py): pure functions of those, kept while the nodes stay the same.
        self.usage_memo: dict[str, tuple[tuple[Allocation, ...], NodeUsage, int]] = {}
        self._static: dict[tuple[int, StaticKey], Reason | None] = {}
        self._passing: dict[StaticKey, tuple[NodeClass, ...]] = {}

    def __len__(self) -> int:
        return len(self.nodes)

    def static_reason(self, cls: NodeClass, task: PendingTask) -> Reason | None:
        """Why the class fails the online, pool, runtime, type or VRAM stage (None: it passes
        them)."""
        if not cls.online:
            return Reason.NODE_OFFLINE
        key = (cls.id, static_key(task))
        if key not in self._static:
            rep = cls.representative
            self._static[key] = next(
                (s.reason for s in STATIC_STAGES if not s.check(task, rep, _NO_USAGE).ok), None
            )
        return self._static[key]

    def passing(self, task: PendingTask) -> tuple[NodeClass, ...]:
        """The online classes whose static stages pass for `task` (pins and exclusions aside)."""
        key = static_key(task)
        hit = self._passing.get(key)
        if hit is None:
            hit = tuple(c for c in self.classes if self.static_reason(c, task) is None)
            self._passing[key] = hit
        return hit

    def any_online_of_type(self, wanted: str) -> bool:
        return any(c.online and any(gpu_matches(g, wanted) for g in c.gpus) for c in self.classes)
