"""A real engine behind the router: llama.cpp's OpenAI server (llama-cpp-python) serving a tiny
random-weight llama model written here, driven with the official `openai` client through
`/serve/{id}/v1` with the tenant's key, on the process runtime (docs/serving.md).

One group of two replicas on ONE process node, so both must get a port of their own (the
platform allocates it and gives it as PORT); then a rollout to a second model file under a
client loop, then idle sleep and a streamed request that wakes the group.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from . import web
from .cluster import Cluster
from .test_e2e_rollout import FAST, all_tasks, live_by_generation, phase_is, rollout
from .test_e2e_serving import ready_replicas, serving, timeline_kinds
from .workloads import llama_server_command, requires_llama_server, write_tiny_llama

pytestmark = [pytest.mark.integration, pytest.mark.slow, requires_llama_server]

# The image is only a name on the process runtime; it is llama-cpp-python's published one,
# so the agent's engine profile has something real to recognise.
IMAGE = "ghcr.io/abetlen/llama-cpp-python:v0.3.36"
COMMAND = llama_server_command("$MODEL", "$ALIAS")
PROMPT = "hello world"


def client(cluster: Cluster, target: str) -> Any:
    """The openai client users would use, through the router. No retries: a failed request
    must show, not be hidden by a second try."""
    import openai

    return openai.OpenAI(
        base_url=f"{cluster.url}/serve/{target}/v1",
        api_key=cluster.creds["tenant_api_key"],
        max_retries=0,
        timeout=60.0,
    )


def complete(cluster: Cluster, target: str) -> tuple[str, int]:
    """(replica, tokens generated) of one plain completion."""
    raw = client(cluster, target).completions.with_raw_response.create(
        model="tiny", prompt=PROMPT, max_tokens=4, temperature=0
    )
    answer = raw.parse()
    assert answer.object == "text_completion" and answer.choices, answer
    return raw.headers["x-heteroflow-replica"], answer.usage.completion_tokens


def served_model(cluster: Cluster, target: str) -> str:
    return str(client(cluster, target).models.list().data[0].id)


def stream(cluster: Cluster, target: str) -> list[tuple[str, str | None]]:
    """(text, finish_reason) of each event of one streamed completion, as they arrived."""
    chunks = client(cluster, target).completions.create(
        model="tiny", prompt=PROMPT, max_tokens=6, temperature=0, stream=True
    )
    return [(c.choices[0].text, c.choices[0].finish_reason) for c in chunks if c.choices]


def streamed(events: list[tuple[str, str | None]]) -> bool:
    """One event per token (a byte-level token may carry no text yet), then the finish."""
    return len(events) >= 6 and events[-1][1] == "length"


class Load(web.Repeat):
    """Completions one after another through the openai client, until stopped."""

    def __init__(self, cluster: Cluster, target: str) -> None:
        super().__init__(join_s=90.0)
        self.client = client(cluster, target)
        self.models: list[str] = []
        self.failures: list[str] = []

    def once(self) -> None:
        import openai

        try:
            self.client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, temperature=0)
            self.models.append(str(self.client.models.list().data[0].id))
        except openai.OpenAIError as exc:
            self.failures.append(repr(exc))


def explain(cluster: Cluster, gid: str) -> str:
    """What the router and each replica say: for a failure's message."""
    lines = [f"serving: {serving(cluster, gid)}"]
    for t in all_tasks(cluster, gid):
        lines.append(f"--- {t['id']} ({t['status']}, serve_address {t.get('serve_address')})")
        lines += cluster.logs(t["id"])[-12:]
    return "\n".join(lines)


@pytest.mark.cluster_env(**FAST, HETEROFLOW_SERVE_IDLE_MINUTE_S="3", HETEROFLOW_SERVE_WAIT_S="60")
def test_llama_cpp_behind_the_router_two_replicas_rollout_sleep_and_wake(
    cluster: Cluster,
) -> None:
    models = cluster.root / "models"
    models.mkdir()
    first = write_tiny_llama(models / "tiny-a.gguf", seed=1)
    second = write_tiny_llama(models / "tiny-b.gguf", seed=2)
    cluster.start_agent("lp1", "process")
    r = web.post(
        f"{cluster.url}/api/v1/task-groups",
        json={
            "name": "llama",
            "image": IMAGE,
            "task_type": "inference",
            "task_count": 2,
            "command": COMMAND,
            "env": {"MODEL": str(first), "ALIAS": "tiny-a"},
            "serving": {"port": 8000, "health_path": "/v1/models"},
            "cpu_cores": 0.5,
            "memory_mb": 1024,
        },
        headers=cluster.tenant,
    )
    assert r.status_code == 201, r.text
    gid = r.json()["id"]
    try:
        ready_s = cluster.wait(
            lambda: len(ready_replicas(cluster, gid)) == 2, "two ready replicas", 90
        )
    except AssertionError as exc:
        raise AssertionError(explain(cluster, gid)) from exc

    # Two replicas on one node, each on a port of its own.
    view = serving(cluster, gid)
    addresses = {rep["address"] for rep in view["replicas"]}
    assert len(addresses) == 2, view["replicas"]
    members = cluster.group(gid)["tasks"]
    assert {t["node_id"] for t in members} == {"lp1"}
    # The agent's engine profile recognised llama.cpp (no card: no vendor part).
    assert {cluster.task(t["id"])["engine"] for t in members} == {"llama.cpp"}

    # Plain completions through the openai client reach both replicas.
    answers = [complete(cluster, gid) for _ in range(12)]
    by_replica = Counter(replica for replica, _ in answers)
    assert set(by_replica) == {t["id"] for t in members}, by_replica
    assert all(tokens > 0 for _, tokens in answers), answers
    # Each replica's own server log shows the requests it answered.
    for t in members:
        served = [x for x in cluster.logs(t["id"]) if "POST /v1/completions" in x]
        assert served, cluster.logs(t["id"])[-20:]
    assert served_model(cluster, gid) == "tiny-a"

    # Streamed: Server-Sent Events through the router, several pieces.
    events = stream(cluster, gid)
    assert streamed(events), events

    # A rollout to the second model file while a client keeps requesting: no request fails.
    with Load(cluster, gid) as load:
        rollout(cluster, gid, env={"MODEL": str(second), "ALIAS": "tiny-b"})
        rollout_s = cluster.wait(
            lambda: phase_is(cluster, gid, "completed", "failed"), "the rollout", 120
        )
        cluster.wait(lambda: served_model(cluster, gid) == "tiny-b", "tiny-b only", 20)
    assert rollout(cluster, gid)["phase"] == "completed", rollout(cluster, gid)
    assert load.failures == [], load.failures[:5]
    assert len(load.models) > 10 and set(load.models) <= {"tiny-a", "tiny-b"}, load.models
    assert live_by_generation(cluster, gid) == {1: 2}
    assert {served_model(cluster, gid) for _ in range(6)} == {"tiny-b"}
    new = [t for t in all_tasks(cluster, gid) if t["generation"] == 1]
    assert {t["node_id"] for t in new} == {"lp1"}
    assert len({rep["address"] for rep in serving(cluster, gid)["replicas"]}) == 2

    # Idle sleep (one "minute" is 3 s here), then a streamed request wakes the group.
    r = web.put(
        f"{cluster.url}/api/v1/task-groups/{gid}",
        json={"idle_timeout_minutes": 1},
        headers=cluster.tenant,
    )
    assert r.status_code == 200, r.text

    def asleep() -> bool:
        g = cluster.group(gid)
        return g["status"] == "sleeping" and all(t["status"] == "sleeping" for t in g["tasks"])

    cluster.wait(asleep, "the idle group asleep", 60)
    sleepers = cluster.group(gid)["tasks"]
    started = time.monotonic()
    events = stream(cluster, gid)
    assert streamed(events), events
    wake_s = time.monotonic() - started
    assert wake_s < 60
    # The figures docs/serving.md quotes (`pytest -s` shows them).
    print(
        f"real-serving: two replicas ready in {ready_s:.1f} s; {len(load.models)} completions"
        f" during the {rollout_s:.1f} s rollout, {len(load.failures)} failed;"
        f" a streamed request woke the sleeping group in {wake_s:.2f} s"
    )
    for t in sleepers:
        kinds = timeline_kinds(cluster, t["id"])
        assert "idle_sleep" in kinds and "request_wake" in kinds, kinds
        assert cluster.statuses(t["id"])[-3:] == ["sleeping", "waking", "running"]
