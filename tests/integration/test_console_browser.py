"""The web console in a real browser (Playwright driving the system's chromium) against a real
`heteroflow up` with a process-runtime agent: sign in, create from the form, watch the task
complete without reloading, its logs and timeline, a form error beside its field, another
tenant's task not found, nodes for operators only.

`HETEROFLOW_CONSOLE_SCREENSHOTS=DIR` saves a screenshot of each page there (docs/console/).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from . import web
from .cluster import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no chromium on this machine (.ci/run installs it)", allow_module_level=True)

WAIT_MS = 30_000
SHOTS = os.environ.get("HETEROFLOW_CONSOLE_SCREENSHOTS", "")


@pytest.fixture
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def shot(page: Page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


def sign_in(browser: Browser, url: str, key: str, width: int = 1280) -> Page:
    page = browser.new_context(viewport={"width": width, "height": 900}).new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto(f"{url}/ui/")
    assert page.url.endswith("/ui/login")
    page.fill("#key", key)
    page.click("button[type=submit]")
    page.wait_for_url(f"{url}/ui/tasks")
    return page


def other_tenant_key(cluster: Cluster) -> str:
    r = web.post(f"{cluster.url}/api/v1/tenants", json={"id": "initech"}, headers=cluster.operator)
    assert r.status_code == 201, r.text
    r = web.post(
        f"{cluster.url}/api/v1/tenants/initech/api-keys", json={}, headers=cluster.operator
    )
    assert r.status_code == 201, r.text
    return str(r.json()["key"])


def test_a_tenant_creates_a_task_and_watches_it_complete(
    cluster: Cluster, browser: Browser
) -> None:
    cluster.start_agent("p1", "process")
    page = sign_in(browser, cluster.url, cluster.creds["tenant_api_key"])
    shot(page, "tasks-empty")

    # A wrong value is named beside its field, and nothing is created.
    page.click("text=New task")
    page.fill("#f-name", "bad")
    page.fill("#f-memory_mb", "lots")
    page.click("button:has-text('Create')")
    expect(page.locator("#e-memory_mb")).to_contain_text("memory_mb")
    shot(page, "new-task-error")

    # A good one runs to the end while the page is watched, not reloaded.
    page.fill("#f-name", "hello")
    page.fill("#f-memory_mb", "256")
    page.fill("#f-command", "echo hello-from-the-console; sleep 2")
    page.click("button:has-text('Create')")
    page.wait_for_url("**/ui/tasks/*")
    task_url = page.url
    expect(page.locator("#status")).to_have_text("completed", timeout=WAIT_MS)
    expect(page.locator("#logs")).to_contain_text("hello-from-the-console")
    assert page.url == task_url  # no navigation happened
    shot(page, "task-completed")

    # A task that runs past its timeout gets a timeline entry, shown live.
    slow = cluster.create(name="slow", image="", command="sleep 60", timeout=1, max_retries=0)
    page.goto(f"{cluster.url}/ui/tasks/{slow['id']}")
    expect(page.locator("#timeline")).to_contain_text("task_timeout", timeout=WAIT_MS)
    shot(page, "task-timeline")

    page.goto(f"{cluster.url}/ui/tasks")
    expect(page.locator("table")).to_contain_text("hello")
    shot(page, "tasks")

    # Another tenant: the same task's URL is not found; the nodes page is not for tenants.
    stranger = sign_in(browser, cluster.url, other_tenant_key(cluster))
    stranger.goto(task_url)
    expect(stranger.locator("main")).to_contain_text("not found")
    stranger.goto(f"{cluster.url}/ui/nodes")
    expect(stranger.locator("h1")).to_have_text("Not allowed")

    # An operator sees the nodes, at phone width too.
    operator = sign_in(browser, cluster.url, cluster.creds["operator_token"], width=390)
    operator.goto(f"{cluster.url}/ui/nodes")
    expect(operator.locator("table")).to_contain_text("p1")
    shot(operator, "nodes-phone")


def test_groups_jobs_and_pools_drawn_in_the_browser(cluster: Cluster, browser: Browser) -> None:
    """What only a browser shows: the DAG's SVG laid out and its task links reachable by
    keyboard, the group and rollout pages as a user meets them, the create forms."""
    cluster.start_agent("p1", "process")
    page = sign_in(browser, cluster.url, cluster.creds["tenant_api_key"])

    # A job from the form: its DAG drawn, a node's link followed with the keyboard.
    page.goto(f"{cluster.url}/ui/jobs/new")
    page.fill("#f-name", "pipeline")
    page.fill("#f-dependencies", "train after prep\nreport after train\nreport resource prep")
    page.fill(
        "#f-tasks",
        '[{"key": "prep", "name": "prep", "image": "", "command": "echo prep"},'
        ' {"key": "train", "name": "train", "image": "", "command": "echo train"},'
        ' {"key": "report", "name": "report", "image": "", "command": "echo report"}]',
    )
    page.click("button:has-text('Submit')")
    page.wait_for_url("**/ui/jobs/job-*")
    job_url = page.url
    job_api = f"{cluster.url}/api/v1/jobs/{job_url.rsplit('/', 1)[1]}"

    def prep_done() -> bool:
        nodes = web.get(job_api, headers=cluster.tenant).json()["tasks"]
        return any(n["key"] == "prep" and n["status"] == "completed" for n in nodes)

    cluster.wait(prep_done, "the job's first task completed", timeout=WAIT_MS / 1000)
    page.reload()  # the job page is read once, not followed
    svg = page.locator("svg.dag-svg")
    expect(svg.locator("text", has_text="✓ completed").first).to_be_visible()
    boxes = [svg.locator("rect").nth(i).bounding_box() for i in range(3)]
    assert all(b and b["width"] > 100 for b in boxes) and len({b["y"] for b in boxes if b}) == 3
    shot(page, "job-dag")
    link = svg.locator("a").first
    link.focus()
    page.keyboard.press("Enter")
    page.wait_for_url("**/ui/tasks/*")
    assert page.url != job_url

    # A group from the form; its page with a schedule window and a rollout started.
    page.goto(f"{cluster.url}/ui/groups/new")
    page.fill("#f-name", "replicas")
    page.fill("#f-task_count", "0")
    page.click("button:has-text('Create')")
    expect(page.locator("#e-task_count")).to_contain_text("greater than or equal to 1")
    page.fill("#f-task_count", "2")
    page.fill("#f-command", "sleep 120")
    page.click("button:has-text('Create')")
    page.wait_for_url("**/ui/groups/grp-*")
    gid = page.url.rsplit("/", 1)[1]
    # Opening in two hours for an hour: closed while the test runs.
    hour = datetime.now(UTC).hour
    start, end = f"{(hour + 2) % 24:02d}:00", f"{(hour + 3) % 24:02d}:00"
    window = {"start": start, "end": end, "timezone": "UTC", "action": "pause"}
    r = web.put(
        f"{cluster.url}/api/v1/task-groups/{gid}",
        json={"schedule_window": window},
        headers=cluster.tenant,
    )
    assert r.status_code == 200, r.text
    page.click("text=Start a rollout")
    page.fill("#f-image", "busybox:latest")
    page.fill("#f-partition", "1")
    page.click("button:has-text('Yes, start')")
    page.wait_for_url(f"**/ui/groups/{gid}")
    expect(page.locator("#generations")).to_contain_text("Replicas by generation")
    expect(page.locator("#window-state")).to_contain_text("closed")
    shot(page, "group")

    # Pools, as an operator: usage against what the matching nodes have.
    r = web.post(
        f"{cluster.url}/api/v1/pools",
        json={"name": "everything", "node_selector": {}},
        headers=cluster.operator,
    )
    assert r.status_code == 201, r.text
    operator = sign_in(browser, cluster.url, cluster.creds["operator_token"])
    operator.goto(f"{cluster.url}/ui/pools")
    expect(operator.locator("table")).to_contain_text("1 of 1")  # one node online
    shot(operator, "pools")
