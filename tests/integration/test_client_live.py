"""The Python client against the real gateway over PostgreSQL: a task created, read, listed
(as a page and through the iterator) and deleted; a refusal raises with the API's fields."""

from __future__ import annotations

import httpx
import pytest

from heteroflow.client import ApiError, AsyncClient
from libs.domain.task.model import TaskSpec
from services.api_gateway.app import create_app

from .helpers import Api


async def test_task_lifecycle_through_the_client(api: Api) -> None:
    app = create_app(api.settings, api.store)
    token = api.tenant["Authorization"].removeprefix("Bearer ")
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with AsyncClient("http://gw", token, transport=transport) as c:
        spec = TaskSpec.model_validate({"name": "client-t", "image": "busybox:latest"})
        made = [await c.tasks.create(spec) for _ in range(3)]
        ids = {t["id"] for t in made}
        assert (await c.tasks.get(made[0]["id"]))["name"] == "client-t"

        page = await c.tasks.list(name="client-t", per_page=2)
        assert page["total"] == 3 and len(page["tasks"]) == 2
        assert {t["id"] async for t in c.tasks.iter(name="client-t", per_page=2)} == ids

        await c.tasks.delete(made[0]["id"])
        with pytest.raises(ApiError) as gone:
            await c.tasks.get(made[0]["id"])
        assert gone.value.status == 404

        with pytest.raises(ApiError) as refused:
            await c.tasks.create({"name": "x", "image": "busybox:latest", "gpuz": 1})
        assert refused.value.status == 400 and refused.value.fields == ["gpuz"]
        assert refused.value.code == 40001
