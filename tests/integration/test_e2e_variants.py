"""Task variants end to end (docs/scheduling.md#variants): the real services and agents on
nodes with declared (simulated) cards of three kinds. A task with the variants
[NVIDIA A100 80 GB, Ascend 910B 64 GB, CPU llama.cpp] lands on the A100 when it is free, on
the Ascend once variant 0's wait is over and the A100 is busy, on CPU once both are busy;
its pending reason names each refusal; the agent runs the placed variant's command and
environment; a GPU OOM on a 24 GB card moves to the 64 GB variant."""

from __future__ import annotations

import subprocess
from datetime import datetime
from typing import Any

import psycopg

from . import web
from .cluster import BIN, Cluster

GB = 1024
# Each variant says which one ran (its env and command, as the agent ran them), then holds
# its cards for the rest of the test.
HOLD = "echo ran $WHICH on ${CUDA_VISIBLE_DEVICES:-${ASCEND_RT_VISIBLE_DEVICES:-cpu}}; sleep 60"
VARIANTS: list[dict[str, Any]] = [
    {
        "gpu_type": "nvidia/A100",
        "gpu_required": 1,
        "image": "vllm/vllm-openai:v0.6.3",
        "env": {"WHICH": "vllm-a100"},
        "wait_s": 1,
    },
    {
        "gpu_type": "huawei/Ascend910B",
        "gpu_required": 1,
        "image": "ascendai/vllm-ascend:v0.6.3",
        "env": {"WHICH": "vllm-ascend"},
        "wait_s": 2,
    },
    {
        "image": "ghcr.io/ggml-org/llama.cpp:server",
        "command": "echo ran llama.cpp on cpu; sleep 60",
    },
]
SMALL = {"cpu_cores": 0.25, "memory_mb": 64}  # several fit on one process node


def stream(cluster: Cluster, task_id: str) -> list[tuple[str, dict[str, Any], datetime]]:
    with psycopg.connect(cluster.database_url) as conn:
        rows = conn.execute(
            "SELECT type, payload, occurred_at FROM events WHERE stream_id = %s ORDER BY version",
            (task_id,),
        ).fetchall()
    return [(str(k), dict(p), at) for k, p, at in rows]


def placements(cluster: Cluster, task_id: str) -> list[tuple[str, int | None, float]]:
    """(node, variant, seconds after submission) of every placement of the task."""
    events = stream(cluster, task_id)
    created = events[0][2]
    return [
        (p["node_id"], p.get("variant"), (at - created).total_seconds())
        for kind, p, at in events
        if kind == "task_status_changed" and p["to_status"] == "scheduled"
    ]


def pending_reasons(cluster: Cluster, task_id: str) -> list[str]:
    return [p["reason"] for kind, p, _ in stream(cluster, task_id) if kind == "task_pending_reason"]


def timeline(cluster: Cluster, task_id: str) -> list[dict[str, Any]]:
    r = web.get(f"{cluster.url}/api/v1/tasks/{task_id}/events", headers=cluster.tenant)
    assert r.status_code == 200, r.text
    return list(r.json()["events"])


def start_agents(cluster: Cluster, cards: dict[str, str]) -> None:
    """`Cluster.start_agent` for every node at once (process runtime, `cards` declared),
    waiting for them together: agents start in seconds each on a loaded machine."""
    for node_id, declared in cards.items():
        env = cluster.env | {
            "HETEROFLOW_NODE_ID": node_id,
            "HETEROFLOW_AGENT_TOKEN": cluster.register(node_id),
            "HETEROFLOW_RUNTIME": "process",
            "HETEROFLOW_DETECT_NVIDIA": "false",
            "HETEROFLOW_HEARTBEAT_INTERVAL_S": "0.5",
            "HETEROFLOW_STATE_DIR": str(cluster.root / "agents" / node_id),
            "HETEROFLOW_DECLARED_GPUS": declared,
        }
        log = open(cluster.root / f"agent-{node_id}.log", "ab")  # noqa: SIM115 - child owns it
        cluster.agents[node_id] = subprocess.Popen(
            [str(BIN), "agent"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    cluster.wait(
        lambda: {n["id"] for n in cluster.nodes() if n["status"] == "online"} >= cards.keys(),
        f"nodes {sorted(cards)} online",
        timeout=60,
    )


def ran(cluster: Cluster, task_id: str, line: str) -> None:
    cluster.wait(
        lambda: any(line in out for out in cluster.logs(task_id)),
        f"{task_id} logs {line!r}: {cluster.logs(task_id)}",
    )


def test_variants_fall_back_in_order_and_oom_moves_on(cluster: Cluster) -> None:
    cluster.start_agent("a100", "process", HETEROFLOW_DECLARED_GPUS=f"nvidia:A100-80GB:{80 * GB}")
    cluster.start_agent(
        "ascend", "process", HETEROFLOW_DECLARED_GPUS=f"huawei:Ascend910B:{64 * GB}"
    )
    cluster.start_agent("rtx", "process", HETEROFLOW_DECLARED_GPUS=f"nvidia:RTX4090:{24 * GB}")

    # A GPU OOM on the 24 GB card: the retry asks for more VRAM and moves to variant 1 at
    # once (its wait of 600 s counts as over), where the same task completes.
    oom = cluster.create(
        name="oom",
        command="echo fits",
        variants=[
            {
                "gpu_type": "nvidia/RTX4090",
                "gpu_required": 1,
                "command": 'echo "torch.OutOfMemoryError: CUDA out of memory"; exit 1',
                "wait_s": 600,
            },
            {"gpu_type": "huawei/Ascend910B", "gpu_required": 1},
        ],
        retry_delay=0,
        **SMALL,
    )
    done = cluster.wait_status(oom["id"], "completed", timeout=60)
    assert [(n, v) for n, v, _ in placements(cluster, oom["id"])] == [("rtx", 0), ("ascend", 1)]
    assert (
        done["variant"] == 1
        and done["retry_count"] == 1
        and done["gpu_label"].startswith("huawei/")
    )
    assert "fits" in cluster.logs(oom["id"])

    # The A100 is free: variant 0, running its own env.
    first = cluster.create(name="first", command=HOLD, variants=VARIANTS, **SMALL)
    cluster.wait_status(first["id"], "running")
    ran(cluster, first["id"], "ran vllm-a100 on")
    assert [(n, v) for n, v, _ in placements(cluster, first["id"])] == [("a100", 0)]
    assert cluster.task(first["id"])["variant"] == 0

    # The A100 busy: refused, then the Ascend once variant 0's wait (1 s) is over.
    second = cluster.create(name="second", command=HOLD, variants=VARIANTS, **SMALL)
    cluster.wait_status(second["id"], "running")
    ran(cluster, second["id"], "ran vllm-ascend on")
    ((node, variant, after),) = placements(cluster, second["id"])
    assert (node, variant) == ("ascend", 1) and after >= 1.0
    assert any(
        r.startswith("insufficient_gpus: variants[0] (nvidia/A100): insufficient_gpus")
        and "variants[1] (huawei/Ascend910B) considered from" in r
        for r in pending_reasons(cluster, second["id"])
    ), pending_reasons(cluster, second["id"])

    # Both busy: CPU (llama.cpp) once variant 1's wait (2 s) is over, no card held; between
    # the two waits its reason named both refusals.
    third = cluster.create(name="third", command=HOLD, variants=VARIANTS, **SMALL)
    cluster.wait_status(third["id"], "running")
    ran(cluster, third["id"], "ran llama.cpp on cpu")
    ((_, variant, after),) = placements(cluster, third["id"])
    assert variant == 2 and after >= 2.0
    assert cluster.task(third["id"])["gpu_ids"] == []
    both = [
        r
        for r in pending_reasons(cluster, third["id"])
        if "variants[0] (nvidia/A100): insufficient_gpus" in r
        and "variants[1] (huawei/Ascend910B): insufficient_gpus" in r
    ]
    assert both and "variants[2] (CPU only) considered from" in both[0], pending_reasons(
        cluster, third["id"]
    )

    # The timeline says which variant each placement ran.
    placed = [e for e in timeline(cluster, third["id"]) if e["kind"] == "variant_placed"]
    assert [e["details"]["variant"] for e in placed] == [2]
    kinds = [(e["kind"], e["details"].get("variant")) for e in timeline(cluster, oom["id"])]
    assert ("variant_placed", 0) in kinds and ("variant_placed", 1) in kinds, kinds
    assert ("retry_escalation", None) in kinds, kinds
