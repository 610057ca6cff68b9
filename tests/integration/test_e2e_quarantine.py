"""Device faults end to end (docs/operations.md, quarantine): a node of four declared A100s,
its kernel log a file the test writes XID lines to. A device-fatal XID quarantines that card
only and requeues the task at once onto another card without spending its retries; the card
comes back after its health probes. An app-caused XID is the user's failure: a normal retry,
nothing quarantined. Both show on the timeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from . import web
from .cluster import Cluster
from .test_cli import hf

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FATAL = "NVRM: Xid (PCI:0000:41:00): 79, pid=4242, name=python, GPU has fallen off the bus."
APP = "NVRM: Xid (PCI:0000:41:00): 13, pid=4243, name=python, Graphics Exception: ESR 0x404600"


def node_events(cluster: Cluster, node_id: str) -> list[str]:
    with psycopg.connect(cluster.database_url) as conn:
        rows = conn.execute(
            "SELECT type FROM events WHERE stream_id = %s ORDER BY version", (node_id,)
        ).fetchall()
    return [r[0] for r in rows]


def node_timeline(cluster: Cluster, node_id: str) -> set[str]:
    """Kinds of the node's timeline entries (`GET /nodes/{id}/events`)."""
    r = web.get(f"{cluster.url}/api/v1/nodes/{node_id}/events", headers=cluster.operator)
    assert r.status_code == 200, r.text
    return {e["kind"] for e in r.json()["events"]}


def node(cluster: Cluster, node_id: str) -> dict[str, Any]:
    return next(n for n in cluster.nodes() if n["id"] == node_id)


def timeline(cluster: Cluster, task_id: str) -> list[dict[str, Any]]:
    r = web.get(f"{cluster.url}/api/v1/tasks/{task_id}/events", headers=cluster.tenant)
    assert r.status_code == 200, r.text
    return list(r.json()["events"])


def kinds(cluster: Cluster, task_id: str) -> set[str]:
    return {e["kind"] for e in timeline(cluster, task_id)}


def faulting(flag: Path) -> str:
    """Runs until `flag` appears, then fails once (the next attempt runs on)."""
    return f"while [ ! -e {flag} ]; do sleep 0.05; done; rm -f {flag}; exit 1"


@pytest.mark.cluster_env(
    HETEROFLOW_QUARANTINE_PROBES="3", HETEROFLOW_QUARANTINE_PROBE_INTERVAL_S="0.3"
)
def test_device_fault_quarantines_the_card_and_an_app_fault_does_not(cluster: Cluster) -> None:
    klog = cluster.root / "kern.log"
    klog.write_text("")
    cluster.start_agent(
        "q1",
        "process",
        HETEROFLOW_DECLARED_GPUS="nvidia:A100-80GB:81920x4",
        HETEROFLOW_KERNEL_LOG=str(klog),
    )
    cards = [g["id"] for g in node(cluster, "q1")["inventory"]["gpus"]]
    assert len(cards) == 4

    # An app-caused XID: the user's failure, retried as usual, no card quarantined.
    app_flag = cluster.root / "app-fault"
    app = cluster.create(command=faulting(app_flag), gpu_required=1, max_retries=1, retry_delay=0)
    cluster.wait_status(app["id"], "running")
    with klog.open("a") as f:
        f.write(APP + "\n")
    app_flag.touch()
    cluster.wait(lambda: cluster.task(app["id"])["retry_count"] == 1, "app fault retried")
    cluster.wait_status(app["id"], "running")
    assert node(cluster, "q1")["quarantined_gpus"] == []
    cluster.wait(lambda: "retry_escalation" in kinds(cluster, app["id"]), "app retry on timeline")
    retried = next(e for e in timeline(cluster, app["id"]) if e["kind"] == "retry_escalation")
    assert retried["details"]["device_verdict"] == "app_caused"

    # A device-fatal XID: that card only is quarantined, the task runs on another card at
    # once with its retries untouched (max_retries 0: a normal failure would end it).
    dev_flag = cluster.root / "device-fault"
    dev = cluster.create(command=faulting(dev_flag), gpu_required=1, max_retries=0)
    first = cluster.wait_status(dev["id"], "running")
    bad = first["gpu_ids"][0]
    # The card left the bus: the heartbeats stop showing it, so its probes fail meanwhile.
    (cluster.root / "agents" / "q1" / "hidden_gpus").write_text(bad + "\n")
    with klog.open("a") as f:
        f.write(FATAL + "\n")
    dev_flag.touch()

    def moved() -> bool:
        t = cluster.task(dev["id"])
        return t["status"] == "running" and t["requeues"] == 1 and bad not in t["gpu_ids"]

    took = cluster.wait(moved, "device fault requeued onto another card", timeout=15)
    again = cluster.task(dev["id"])
    assert again["retry_count"] == 0 and again["node_id"] == "q1"
    quarantined = node(cluster, "q1")["quarantined_gpus"]
    assert [q["gpu_id"] for q in quarantined] == [bad]
    assert quarantined[0]["code"] == "xid:79" and "fallen off the bus" in quarantined[0]["evidence"]
    assert quarantined[0]["task_id"] == dev["id"]
    assert node(cluster, "q1")["status"] == "online"  # the node is not cordoned
    cluster.wait(
        lambda: {"card_quarantined", "device_requeue"} <= kinds(cluster, dev["id"]),
        "quarantine and requeue on the task's timeline",
    )
    print(f"device fault -> running on another card: {took:.2f}s")

    # Back on the bus: three passed probes return it.
    (cluster.root / "agents" / "q1" / "hidden_gpus").write_text("")
    cluster.wait(lambda: "card_restored" in node_events(cluster, "q1"), "card restored")
    assert node(cluster, "q1")["quarantined_gpus"] == []
    assert node_events(cluster, "q1").count("card_quarantined") == 1
    cluster.wait(
        lambda: {"card_quarantined", "card_restored"} <= node_timeline(cluster, "q1"),
        "quarantine and return on the node's timeline",
    )


def test_operator_quarantines_and_uncordons_a_card(cluster: Cluster) -> None:
    cluster.start_agent("q2", "process", HETEROFLOW_DECLARED_GPUS="nvidia:L4:23034x2")
    card = node(cluster, "q2")["inventory"]["gpus"][0]["id"]
    url = f"{cluster.url}/api/v1/nodes/q2/gpus/{card}"
    r = web.post(f"{url}/quarantine", json={"reason": "fan failing"}, headers=cluster.operator)
    assert r.status_code == 200, r.text
    assert [(q["gpu_id"], q["code"], q["by"]) for q in r.json()["quarantined_gpus"]] == [
        (card, "manual", "operator")
    ]
    # No new placement on it: two one-card tasks, one runs on the other card, one waits.
    a = cluster.create(command="sleep 60", gpu_required=1)
    b = cluster.create(command="sleep 60", gpu_required=1)
    cluster.wait(
        lambda: sorted(cluster.task(t["id"])["status"] for t in (a, b)) == ["pending", "running"],
        "one placed on the other card, one waiting",
    )
    assert all(card not in cluster.task(t["id"])["gpu_ids"] for t in (a, b))
    back = hf(cluster, "nodes", "uncordon-card", "q2", card, token="operator_token")
    assert back.returncode == 0, back.stderr
    assert node(cluster, "q2")["quarantined_gpus"] == []
    cluster.wait(
        lambda: all(cluster.task(t["id"])["status"] == "running" for t in (a, b)),
        "the waiting task placed on the returned card",
    )
    again = web.post(f"{url}/uncordon", headers=cluster.operator)
    assert again.status_code >= 400 and "not quarantined" in again.text
