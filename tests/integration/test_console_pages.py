"""The console's group, job and pool pages through the gateway app over a real store: serving
figures as charts, the schedule window's state, rollout progress by generation and the
rollout's actions (confirmation, CSRF), pool usage, the job's DAG drawn with its edges, and
the create forms for groups and jobs with the API's errors beside their fields."""

from __future__ import annotations

import re
from datetime import UTC, datetime, time, timedelta
from urllib.parse import urlencode

from libs.domain.node.events import NodeRegistered
from libs.domain.node.model import GpuCard, NodeInventory
from libs.domain.reasons import ReasonCode
from libs.domain.task.decide import decide_transition
from libs.domain.task.states import Actor, TaskStatus
from libs.store.projections import NODES
from services.api_gateway.console.web import csrf_token

from .helpers import Api
from .test_console import FORM, signed_in

GROUP = {"name": "web", "image": "busybox:latest", "command": "true", "task_count": 3}


def form(key: str, **fields: str) -> str:
    return urlencode({"csrf": csrf_token(key)} | fields)


async def make_group(api: Api, **extra: object) -> str:
    r = await api.client.post("/api/v1/task-groups", json=GROUP | extra, headers=api.tenant)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def rollout_of(api: Api, gid: str) -> dict[str, object]:
    r = await api.client.get(f"/api/v1/task-groups/{gid}/rollout", headers=api.tenant)
    assert r.status_code == 200, r.text
    return dict(r.json())


async def test_serving_figures_are_charts_with_text_and_the_window_state_is_told(
    api: Api,
) -> None:
    await signed_in(api, api.tenant)
    # Open all day, only on the day after tomorrow: closed now (even past midnight), opening
    # at that day's start.
    opening = (datetime.now(UTC) + timedelta(days=2)).date()
    day = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")[opening.weekday()]
    window = {"start": "00:00", "end": "00:00", "days": [day], "action": "pause"}
    gid = await make_group(api, serving={"port": 8000}, schedule_window=window)
    page = await api.client.get(f"/ui/groups/{gid}")
    assert page.status_code == 200, page.text
    serving = page.text[page.text.index('id="serving"') :]
    assert '<svg class="bar" role="img" aria-label="replicas ready: 0 of 3"' in serving
    assert 'aria-label="requests per second: last 0.0' in serving
    assert 'aria-label="latency p95 ms: last 0.0' in serving
    assert "0 of 3" in serving and "{&#34;" not in page.text  # figures, not raw JSON
    state = re.search(r'id="window-state">(.*?)</dd>', page.text)
    assert state is not None
    assert "closed" in state.group(1) and "pause applies" in state.group(1)
    nxt = re.search(r"(opens|closes) at <time>([^<]+)</time>", page.text)
    assert nxt is not None and nxt.group(1) == "opens"
    assert datetime.fromisoformat(nxt.group(2)) == datetime.combine(opening, time(0), UTC)


async def test_a_rollout_is_started_paused_resumed_and_rolled_back_from_the_page(api: Api) -> None:
    key = await signed_in(api, api.tenant)
    gid = await make_group(api)
    page = await api.client.get(f"/ui/groups/{gid}")
    assert f"/ui/groups/{gid}/rollout/start" in page.text
    assert f"/ui/groups/{gid}/rollout/pause" not in page.text  # nothing to pause yet
    confirm = await api.client.get(f"/ui/groups/{gid}/rollout/start")
    assert confirm.status_code == 200 and 'id="f-image"' in confirm.text

    # What the API refuses is named beside its field, and nothing starts.
    start = f"/ui/groups/{gid}/rollout/start"
    r = await api.client.post(start, content=form(key, image=""), headers=FORM)
    assert r.status_code == 400 and 'id="e-image"' in r.text and "nothing to roll out" in r.text
    r = await api.client.post(start, content=form(key, max_surge="lots"), headers=FORM)
    assert r.status_code == 400 and 'id="e-max_surge"' in r.text, r.text
    assert (await rollout_of(api, gid))["phase"] is None
    # Without the token: refused, nothing starts.
    r = await api.client.post(start, content="image=busybox%3A2", headers=FORM)
    assert r.status_code == 403 and (await rollout_of(api, gid))["phase"] is None

    body = form(key, image="busybox:2", partition="1")
    r = await api.client.post(start, content=body, headers=FORM)
    assert r.status_code == 303 and r.headers["location"] == f"/ui/groups/{gid}", r.text
    rollout = await rollout_of(api, gid)
    assert (rollout["phase"], rollout["generation"]) == ("running", 1)
    page = await api.client.get(f"/ui/groups/{gid}")
    table = page.text[page.text.index('id="generations"') :]
    assert re.search(r"<td>0</td><td>3</td><td>0</td><td>previous</td>", table), table[:600]
    assert "partition 1" in page.text and "busybox:2" in page.text
    for offered in ("pause", "rollback", "partition"):
        assert f"/ui/groups/{gid}/rollout/{offered}" in page.text

    for action, phase in (("pause", "paused"), ("resume", "running")):
        confirm = await api.client.get(f"/ui/groups/{gid}/rollout/{action}")
        assert confirm.status_code == 200 and f"Yes, {action}" in confirm.text
        url = f"/ui/groups/{gid}/rollout/{action}"
        r = await api.client.post(url, content=form(key), headers=FORM)
        assert r.status_code == 303, r.text
        assert (await rollout_of(api, gid))["phase"] == phase
    # Resuming a running rollout: the API's refusal, naming the phase.
    r = await api.client.post(f"/ui/groups/{gid}/rollout/resume", content=form(key), headers=FORM)
    assert r.status_code == 400 and "phase running" in r.text

    url = f"/ui/groups/{gid}/rollout/partition"
    r = await api.client.post(url, content=form(key, partition="-1"), headers=FORM)
    assert r.status_code == 400 and 'id="e-partition"' in r.text
    r = await api.client.post(url, content=form(key, partition="3"), headers=FORM)
    assert r.status_code == 303, r.text
    assert (await rollout_of(api, gid))["request"]["partition"] == 3  # type: ignore[index]

    url = f"/ui/groups/{gid}/rollout/rollback"
    r = await api.client.post(url, content=form(key), headers=FORM)
    assert r.status_code == 303 and (await rollout_of(api, gid))["phase"] == "rollback"
    assert (await api.client.get(f"/ui/groups/{gid}/rollout/nothing")).status_code == 404


async def test_pools_show_usage_against_capacity(api: Api) -> None:
    cards = tuple(
        GpuCard(id=f"n1-g{i}", index=i, vendor="nvidia", model="L4", vram_mb=24_576)
        for i in range(2)
    )
    registered = NodeRegistered(
        node_id="n1", inventory=NodeInventory(memory_mb=65_536, cpu_cores=16, gpus=cards)
    )
    await api.store.execute_aggregate(NODES, "n1", lambda _n: [registered])
    pool = {"name": "l4s", "node_selector": {"gpu_type": "L4"}}
    r = await api.client.post("/api/v1/pools", json=pool, headers=api.operator)
    assert r.status_code == 201, r.text
    task = {"name": "t", "image": "busybox", "gpu_required": 1, "memory_mb": 4096}
    r = await api.client.post("/api/v1/tasks", json=task, headers=api.tenant)
    assert r.status_code == 201, r.text
    await api.store.execute(  # placed as the scheduler places it
        r.json()["id"],
        lambda t: decide_transition(
            t,
            TaskStatus.SCHEDULED,
            actor=Actor.SCHEDULER,
            reason_code=ReasonCode.REPORTED,
            node_id="n1",
            gpu_ids=("n1-g0",),
        ),
    )
    await signed_in(api, api.tenant)
    page = await api.client.get("/ui/pools")
    assert page.status_code == 200, page.text
    row = page.text[page.text.index(">l4s") :].split("</tr>")[0]
    assert '<meter min="0" max="2" value="1" aria-label="GPUs in use">' in row, row
    assert "1 of 2" in row and "4096 of 65536 MB" in row


async def test_the_job_dag_is_drawn_with_its_edges(api: Api) -> None:
    await signed_in(api, api.tenant)
    body = {
        "name": "pipe",
        "tasks": [
            {"key": "prepare", "name": "p", "image": "busybox:latest"},
            {"key": "train", "name": "t", "image": "busybox:latest"},
            {"key": "report", "name": "r", "image": "busybox:latest"},
        ],
        "dependencies": [
            {"task": "train", "on": "prepare"},
            {"task": "report", "on": "prepare", "kind": "resource"},
            {"task": "report", "on": "train"},
        ],
    }
    r = await api.client.post("/api/v1/jobs", json=body, headers=api.tenant)
    assert r.status_code == 201, r.text
    job = r.json()
    page = await api.client.get(f"/ui/jobs/{job['id']}")
    assert page.status_code == 200, page.text
    svg = re.search(r'<svg class="dag-svg".*?</svg>', page.text, re.S)
    assert svg is not None
    edges = re.findall(r"<title>(\w+) waits on (\w+) \((\w+)\)</title>", svg.group(0))
    assert sorted(edges) == [
        ("report", "prepare", "resource"),
        ("report", "train", "after"),
        ("train", "prepare", "after"),
    ]
    assert svg.group(0).count('marker-end="url(#arrow)"') == 3
    assert svg.group(0).count('stroke-dasharray="6 4"') == 1  # the resource dependency
    # Each node's status as text with its symbol; the first one links to its task.
    prepare = next(n for n in job["tasks"] if n["key"] == "prepare")
    assert f'<a href="/ui/tasks/{prepare["task"]["id"]}">' in svg.group(0)
    assert re.search(r"◷ pending</text>", svg.group(0)), svg.group(0)[:800]
    assert "waiting" in svg.group(0) or "why: " in page.text


async def test_a_group_is_created_from_the_form_with_errors_beside_fields(api: Api) -> None:
    key = await signed_in(api, api.tenant)
    assert (await api.client.get("/ui/groups/new")).status_code == 200
    bad = form(key, name="g", image="busybox:latest", task_count="0")
    r = await api.client.post("/ui/groups/new", content=bad, headers=FORM)
    assert r.status_code == 400 and 'id="e-task_count"' in r.text, r.text
    listed = await api.client.get("/api/v1/task-groups", headers=api.tenant)
    assert listed.json()["total"] == 0
    good = form(key, name="g", image="busybox:latest", task_count="2", parallelism="split")
    r = await api.client.post("/ui/groups/new", content=good, headers=FORM)
    assert r.status_code == 303, r.text
    gid = r.headers["location"].rsplit("/", 1)[1]
    r = await api.client.get(f"/api/v1/task-groups/{gid}", headers=api.tenant)
    assert r.json()["replicas"] == 2 and r.json()["name"] == "g"


async def test_a_job_is_submitted_from_the_form_with_errors_beside_fields(api: Api) -> None:
    key = await signed_in(api, api.tenant)
    page = await api.client.get("/ui/jobs/new")
    assert page.status_code == 200 and 'id="f-dependencies"' in page.text
    tasks = (
        '[{"key": "a", "name": "a", "image": "busybox"},'
        ' {"key": "b", "name": "b", "image": "busybox", "gpus": 1}]'
    )
    cases = [
        (form(key, name="j", tasks="[not json"), "tasks"),
        (form(key, name="j", tasks=tasks, dependencies="b needs a"), "dependencies"),
        (form(key, name="j", tasks=tasks, dependencies="b after a"), "tasks"),  # the API's
    ]
    for body, field in cases:
        r = await api.client.post("/ui/jobs/new", content=body, headers=FORM)
        assert r.status_code == 400 and f'id="e-{field}"' in r.text, (field, r.text)
    r = await api.client.post("/ui/jobs/new", content=cases[2][0], headers=FORM)
    assert "tasks[1].gpus" in r.text  # the API's own message, beside `tasks`
    assert (await api.client.get("/api/v1/jobs", headers=api.tenant)).json()["total"] == 0
    good = tasks.replace(', "gpus": 1', "")
    body = form(key, name="j", tasks=good, dependencies="b after a")
    r = await api.client.post("/ui/jobs/new", content=body, headers=FORM)
    assert r.status_code == 303, r.text
    page = await api.client.get(r.headers["location"])
    assert "<title>b waits on a (after)</title>" in page.text
