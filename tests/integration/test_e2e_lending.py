"""Card lending end to end (docs/serving.md#card-lending): a process node with one declared card,
a fake engine that answers `/sleep` and `/wake_up` and keeps the card's VRAM figure in the
node's declared-VRAM file (the stand-in for NVML), the real control plane and agent.

Lent: the engine slept through `/sleep` and released its memory; a training task of the same
tenant runs on its card; waking the engine answers 202 `queued`; when the training task ends
the scheduler completes the wake. Never lent: an engine without `/sleep` is paused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from . import web
from .cluster import BIN, Cluster, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CARD = "card-a"
GPUS = json.dumps([{"vendor": "nvidia", "model": "L4", "vram_mb": 23034, "uuid": CARD}])
# argv: port, VRAM file, card id, "engine" (answers /sleep and /wake_up) or "plain" (404).
ENGINE = """
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

port, path, card, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]


def hold(mb):
    with open(path + ".tmp", "w") as f:
        json.dump({card: mb}, f)
    os.replace(path + ".tmp", path)


class Handler(BaseHTTPRequestHandler):
    def answer(self, code):
        self.send_response(code)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def do_GET(self):
        self.answer(200)

    def do_POST(self):
        if mode != "engine":
            return self.answer(404)
        if self.path.startswith("/sleep"):
            hold(1000.0)
        elif self.path.startswith("/wake_up"):
            hold(20000.0)
        self.answer(200)

    def log_message(self, *args):
        pass


hold(20000.0)
HTTPServer(("0.0.0.0", port), Handler).serve_forever()
"""


def start_node(cluster: Cluster) -> Path:
    vram = cluster.root / "vram.json"
    cluster.start_agent(
        "ln1",
        "process",
        HETEROFLOW_DECLARED_GPUS=GPUS,
        HETEROFLOW_DECLARED_VRAM_FILE=str(vram),
    )
    return vram


def create_engine(cluster: Cluster, vram: Path, mode: str) -> dict[str, Any]:
    script = cluster.root / "engine.py"
    script.write_text(ENGINE)
    # The declared port; on the process runtime the replica listens on the port the
    # platform allocated for it (`PORT`), on the node's advertised address.
    port = free_port()
    return cluster.create(
        name=f"engine-{mode}",
        command=f'exec {sys.executable} {script} "$PORT" {vram} {CARD} {mode}',
        task_type="inference",
        serving={"port": port, "health_path": "/healthz"},
        gpu_required=1,
    )


def cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = cluster.env | {
        "HETEROFLOW_SERVER": cluster.url,
        "HETEROFLOW_TOKEN": cluster.creds["tenant_api_key"],
        "HETEROFLOW_HOME": str(cluster.root / "cli-home"),
    }
    return subprocess.run(
        [str(BIN), *args], env=env, capture_output=True, text=True, timeout=30, check=False
    )


def ops(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"HETEROFLOW_DATABASE_URL": cluster.database_url}
    return subprocess.run(
        [str(BIN), *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def post(cluster: Cluster, task_id: str, op: str) -> Any:
    return web.post(f"{cluster.url}/api/v1/tasks/{task_id}/{op}", headers=cluster.tenant)


def timeline(cluster: Cluster, task_id: str) -> dict[str, dict[str, Any]]:
    r = web.get(f"{cluster.url}/api/v1/tasks/{task_id}/events", headers=cluster.tenant)
    assert r.status_code == 200, r.text
    return {e["kind"]: e for e in r.json()["events"]}


def answers(url: str) -> bool:
    try:
        return web.get(url).status_code == 200
    except httpx.HTTPError:
        return False


def asleep(cluster: Cluster, engine: dict[str, Any]) -> dict[str, Any]:
    """Put the engine to sleep, once it answers; the measurement of that sleep, once recorded.
    `running` means the process started: an engine still loading writes no VRAM figure yet,
    and a sleep then has no reading before it."""
    address = cluster.wait_status(engine["id"], "running", timeout=30)["serve_address"]
    cluster.wait(lambda: answers(f"http://{address}/healthz"), "the engine answering")
    assert post(cluster, engine["id"], "sleep").status_code == 200
    cluster.wait(lambda: "sleep_measured" in timeline(cluster, engine["id"]), "sleep measured")
    return timeline(cluster, engine["id"])["sleep_measured"]


def test_a_released_card_is_lent_and_the_wake_waits_for_the_borrower(cluster: Cluster) -> None:
    vram = start_node(cluster)
    engine = create_engine(cluster, vram, "engine")
    measured = asleep(cluster, engine)
    details = measured["details"]
    assert details["sleep_mode"] == "engine" and details["released"] is True, details
    assert (details["vram_before_mb"], details["vram_after_mb"]) == (20000.0, 1000.0)
    assert cluster.task(engine["id"])["sleep_released"] is True

    done = cluster.root / "done"
    train = cluster.create(
        name="train",
        command=f"while [ ! -e {done} ]; do sleep 0.2; done",
        task_type="training",
        gpu_required=1,
    )
    borrower = cluster.wait_status(train["id"], "running", timeout=30)
    assert borrower["borrowed_from"] == engine["id"] and borrower["gpu_ids"] == [CARD]
    assert cluster.task(engine["id"])["lent_to"] == train["id"]

    r = post(cluster, engine["id"], "wake")
    assert r.status_code == 202, r.text
    assert r.json()["status"] == "queued" and r.json()["id"] == engine["id"]
    lender = cluster.task(engine["id"])
    assert lender["status"] == "sleeping" and lender["wake_queued"] is True
    again = cli(cluster, "wake", engine["id"])  # the CLI says so too; nothing new is recorded
    assert again.returncode == 0 and "queued: the card is lent" in again.stdout, again

    done.touch()  # the borrower ends: the scheduler gives the card back and wakes the engine
    cluster.wait_status(train["id"], "completed", timeout=30)
    woken = cluster.wait_status(engine["id"], "running", timeout=30)
    assert (woken["lent_to"], woken["wake_queued"]) == ("", False)
    assert cluster.statuses(engine["id"])[-3:] == ["sleeping", "waking", "running"]
    assert json.loads(vram.read_text()) == {CARD: 20000.0}, "woken through /wake_up"
    cluster.wait(
        lambda: (
            {"card_lent", "wake_queued", "card_returned", "wake_completed"}
            <= set(timeline(cluster, engine["id"]))
        ),
        "the lender's lending entries",
    )
    lent = timeline(cluster, engine["id"])
    assert lent["card_lent"]["details"]["borrower_task_id"] == train["id"]
    assert lent["card_returned"]["details"]["borrower_status"] == "completed"
    assert "card_borrowed" in timeline(cluster, train["id"])

    # Asleep again it is lendable again; a lender whose wake is queued is deleted at once.
    assert post(cluster, engine["id"], "sleep").status_code == 200
    cluster.wait(lambda: cluster.task(engine["id"])["sleep_released"] is True, "measured again")
    done2 = cluster.root / "done2"
    second = cluster.create(
        name="train2",
        command=f"while [ ! -e {done2} ]; do sleep 0.2; done",
        task_type="training",
        gpu_required=1,
    )
    assert cluster.wait_status(second["id"], "running", timeout=30)["borrowed_from"] == engine["id"]
    assert post(cluster, engine["id"], "wake").json()["status"] == "queued"
    r = web.delete(f"{cluster.url}/api/v1/tasks/{engine['id']}", headers=cluster.tenant)
    assert r.status_code == 200, r.text
    cluster.wait(lambda: cluster.statuses(engine["id"])[-1] == "stopped", "the lender stopped")
    assert cluster.task(second["id"])["status"] == "running", "the borrower runs on"
    done2.touch()
    cluster.wait_status(second["id"], "completed", timeout=30)
    # The log proves no card was held twice (the lent card counted for its borrower only),
    # and replaying it rebuilds the same rows (the lending fields included).
    for args in (("check", "history", "--json"), ("events", "replay", "--dry-run")):
        result = ops(cluster, *args)
        assert result.returncode == 0, result.stdout + result.stderr


def test_a_paused_sleeper_is_never_lent(cluster: Cluster) -> None:
    vram = start_node(cluster)
    engine = create_engine(cluster, vram, "plain")
    details = asleep(cluster, engine)["details"]
    assert details["sleep_mode"] == "pause" and details["released"] is False
    train = cluster.create(name="train", command="true", task_type="training", gpu_required=1)
    # The round that answers why it waits is a round that found no lendable card.
    cluster.wait(
        lambda: cluster.task(train["id"])["pending_reason_code"] == "insufficient_gpus",
        "the training task waiting for a card",
    )
    assert cluster.task(train["id"])["status"] == "pending"
    assert cluster.task(engine["id"])["lent_to"] == ""
    r = post(cluster, engine["id"], "wake")
    assert r.status_code == 200 and r.json()["status"] == "running", r.text
    # Awake again, the card is the engine's: the training task still waits.
    assert cluster.task(train["id"])["status"] == "pending"
