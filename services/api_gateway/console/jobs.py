"""The console's job pages: the create form (tasks as the API's JSON, dependencies one per
line) and a job's page with its DAG drawn (dag.py) and listed with why each task waits."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .charts import dag_levels
from .dag import draw, symbol
from .forms import job_body
from .web import Form, Key, api_client, create, ok, page

router = APIRouter()
EXAMPLE_TASKS = """[
  {"key": "prep", "name": "prep", "image": "busybox:latest", "command": "echo prep"},
  {"key": "train", "name": "train", "image": "busybox:latest", "command": "echo train"}
]"""


@router.get("/jobs/new")
async def new_job(request: Request, _key: Key) -> Response:
    return _job_form(request, {"tasks": EXAMPLE_TASKS, "dependencies": "train after prep"}, {}, 200)


@router.post("/jobs/new")
async def create_job(request: Request, key: Key, form: Form) -> Response:
    problems = await create(request, key, job_body(form), "/jobs", "/ui/jobs")
    if isinstance(problems, Response):
        return problems
    return _job_form(request, form, problems, 400)


def _job_form(
    request: Request, form: dict[str, str], problems: dict[str, str], status: int
) -> Response:
    return page(
        request,
        "new_job.html",
        status,
        title="New job",
        form=form,
        error=problems.get("", ""),
        fields=problems,
    )


@router.get("/jobs/{job_id}")
async def job_detail(request: Request, job_id: str, key: Key) -> Response:
    """The job's DAG drawn with its edges, and listed by depth: each task with its status
    and why it waits."""
    async with api_client(request, key) as api:
        job = ok(request, await api.get(f"/jobs/{job_id}"))
    return page(
        request,
        "job.html",
        title=job["name"],
        job=job,
        drawing=draw(job["tasks"]),
        levels=dag_levels(job["tasks"]),
        symbol=symbol,
    )
