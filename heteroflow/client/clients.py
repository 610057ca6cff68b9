"""`Client` (blocking) and `AsyncClient` (asyncio) over httpx, with one resource per kind:
`client.tasks`, `.groups`, `.jobs`, `.queues`, `.pools`, each with create/get/list/iter/
update/delete and `action` for the POST verbs (stop, sleep, wake, scale, rollout)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel

from heteroflow.cli_user.client import resolve_target

from .core import (
    API_PREFIX,
    DEFAULT_PER_PAGE,
    TIMEOUT_S,
    Unreachable,
    api_error,
    body_of,
    clean_params,
    page_items,
    retry_wait,
)

Body = BaseModel | Mapping[str, Any] | None

# name -> (path, key of the list's items, paged)
KINDS: dict[str, tuple[str, str, bool]] = {
    "tasks": ("/tasks", "tasks", True),
    "groups": ("/groups", "groups", True),
    "jobs": ("/jobs", "jobs", True),
    "queues": ("/queues", "queues", False),
    "pools": ("/pools", "pools", False),
}


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _json(response: httpx.Response) -> dict[str, Any]:
    """The answer's JSON object ({} for an empty answer, `{"items": [...]}` for a list)."""
    if not response.content:
        return {}
    data = response.json()
    return data if isinstance(data, dict) else {"items": data}


class Resource:
    """One kind's routes on a blocking client."""

    def __init__(self, client: Client, path: str, key: str, paged: bool) -> None:
        self._c, self.path, self.key, self.paged = client, path, key, paged

    def create(self, body: Body, **params: Any) -> dict[str, Any]:
        return self._c.request("POST", self.path, body=body, params=params)

    def get(self, ident: str) -> dict[str, Any]:
        return self._c.request("GET", f"{self.path}/{ident}")

    def list(self, **params: Any) -> dict[str, Any]:
        """One page as the API answers it (`{key: [...], total, page, per_page}`)."""
        return self._c.request("GET", self.path, params=params)

    def iter(self, **params: Any) -> Iterator[dict[str, Any]]:
        """Every item, page after page."""
        if not self.paged:
            yield from self.list(**params).get(self.key) or []
            return
        page = int(params.pop("page", 1))
        params.setdefault("per_page", DEFAULT_PER_PAGE)
        while True:
            items, more = page_items(self.list(page=page, **params), self.key)
            yield from items
            if not more:
                return
            page += 1

    def update(self, ident: str, body: Body) -> dict[str, Any]:
        return self._c.request("PUT", f"{self.path}/{ident}", body=body)

    def delete(self, ident: str) -> dict[str, Any]:
        return self._c.request("DELETE", f"{self.path}/{ident}")

    def action(self, ident: str, verb: str, body: Body = None, **params: Any) -> dict[str, Any]:
        """`POST {path}/{ident}/{verb}` (stop, sleep, wake, scale, rollout, rollout/pause...)."""
        return self._c.request("POST", f"{self.path}/{ident}/{verb}", body=body, params=params)


class Client:
    """A blocking client. Server and token: arguments, then `HETEROFLOW_SERVER` /
    `HETEROFLOW_TOKEN`, then `$HETEROFLOW_HOME/credentials.json`, as the CLI resolves them."""

    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        *,
        operator: bool = False,
        credentials_path: Path | None = None,
        timeout: float = TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        target = resolve_target(server, token, operator=operator, credentials_path=credentials_path)
        self.server, self.token = target.server, target.token
        self._sleep = sleep
        self._http = httpx.Client(
            base_url=self.server + API_PREFIX,
            headers=_headers(self.token),
            timeout=timeout,
            transport=transport,
        )
        for name, (path, key, paged) in KINDS.items():
            setattr(self, name, Resource(self, path, key, paged))

    tasks: Resource
    groups: Resource
    jobs: Resource
    queues: Resource
    pools: Resource

    def request(
        self, method: str, path: str, *, body: Body = None, params: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """One call: retried on 429/503 with Retry-After when `method` is idempotent; a
        refusal raises `ApiError`; the answer's JSON otherwise."""
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    method, path, params=clean_params(params), json=body_of(body)
                )
            except httpx.HTTPError as exc:
                raise Unreachable(f"cannot reach {self.server}: {exc or type(exc)}") from None
            if response.status_code < 400:
                return _json(response)
            wait = retry_wait(method, response, attempt)
            if wait is None:
                raise api_error(response)
            self._sleep(wait)
            attempt += 1

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class AsyncResource:
    """One kind's routes on an asyncio client."""

    def __init__(self, client: AsyncClient, path: str, key: str, paged: bool) -> None:
        self._c, self.path, self.key, self.paged = client, path, key, paged

    async def create(self, body: Body, **params: Any) -> dict[str, Any]:
        return await self._c.request("POST", self.path, body=body, params=params)

    async def get(self, ident: str) -> dict[str, Any]:
        return await self._c.request("GET", f"{self.path}/{ident}")

    async def list(self, **params: Any) -> dict[str, Any]:
        return await self._c.request("GET", self.path, params=params)

    async def iter(self, **params: Any) -> AsyncIterator[dict[str, Any]]:
        if not self.paged:
            for item in (await self.list(**params)).get(self.key) or []:
                yield item
            return
        page = int(params.pop("page", 1))
        params.setdefault("per_page", DEFAULT_PER_PAGE)
        while True:
            items, more = page_items(await self.list(page=page, **params), self.key)
            for item in items:
                yield item
            if not more:
                return
            page += 1

    async def update(self, ident: str, body: Body) -> dict[str, Any]:
        return await self._c.request("PUT", f"{self.path}/{ident}", body=body)

    async def delete(self, ident: str) -> dict[str, Any]:
        return await self._c.request("DELETE", f"{self.path}/{ident}")

    async def action(
        self, ident: str, verb: str, body: Body = None, **params: Any
    ) -> dict[str, Any]:
        path = f"{self.path}/{ident}/{verb}"
        return await self._c.request("POST", path, body=body, params=params)


class AsyncClient:
    """The asyncio twin of `Client` (same resolution of server and token)."""

    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        *,
        operator: bool = False,
        credentials_path: Path | None = None,
        timeout: float = TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        target = resolve_target(server, token, operator=operator, credentials_path=credentials_path)
        self.server, self.token = target.server, target.token
        self._sleep = sleep
        self._http = httpx.AsyncClient(
            base_url=self.server + API_PREFIX,
            headers=_headers(self.token),
            timeout=timeout,
            transport=transport,
        )
        for name, (path, key, paged) in KINDS.items():
            setattr(self, name, AsyncResource(self, path, key, paged))

    tasks: AsyncResource
    groups: AsyncResource
    jobs: AsyncResource
    queues: AsyncResource
    pools: AsyncResource

    async def request(
        self, method: str, path: str, *, body: Body = None, params: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        attempt = 0
        while True:
            try:
                response = await self._http.request(
                    method, path, params=clean_params(params), json=body_of(body)
                )
            except httpx.HTTPError as exc:
                raise Unreachable(f"cannot reach {self.server}: {exc or type(exc)}") from None
            if response.status_code < 400:
                return _json(response)
            wait = retry_wait(method, response, attempt)
            if wait is None:
                raise api_error(response)
            await self._sleep(wait)
            attempt += 1

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()
