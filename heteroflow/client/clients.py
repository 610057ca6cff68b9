"""`Client` (blocking) and `AsyncClient` (asyncio) over httpx. Both carry the same resources
(routes.py): `tasks`, `groups`, `jobs`, `queues`, `pools`, `nodes`, `tenants`; `send` is one
call answered as an httpx response (retried, refusals raised), `events` a Server-Sent
Events stream, `serve` a request to an inference target through the gateway's router."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from .core import (
    API_PREFIX,
    DEFAULT_PER_PAGE,
    TIMEOUT_S,
    SseEvent,
    SseParser,
    Unreachable,
    api_error,
    body_of,
    clean_params,
    page_items,
    parse_sse,
    retry_wait,
    stream_error,
)
from .credentials import resolve_target
from .routes import Body, Groups, Jobs, Nodes, Pools, Queues, Tasks, Tenants, seg

JSON = dict[str, Any]


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _json(response: httpx.Response) -> JSON:
    """The answer's JSON object ({} for an empty answer, `{"items": [...]}` for a list)."""
    if not response.content:
        return {}
    data = response.json()
    return data if isinstance(data, dict) else {"items": data}


def _first_page(params: dict[str, Any]) -> int:
    params.setdefault("per_page", DEFAULT_PER_PAGE)
    return int(params.pop("page", 1))


def _line_of(event: SseEvent) -> str | None:
    """A log line, None at the stream's `end`; an `error` event raises."""
    if event.event == "error":
        raise stream_error(event)
    return None if event.event == "end" else event.data


STREAM_TIMEOUT = httpx.Timeout(TIMEOUT_S, read=None)  # a quiet task sends nothing for long


class Client:
    """A blocking client. Server and token: arguments, then `HETEROFLOW_SERVER` /
    `HETEROFLOW_TOKEN`, then `$HETEROFLOW_HOME/credentials.json`, as the CLI resolves them.
    `http`: an httpx client of one's own (its base URL must end in /api/v1)."""

    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        *,
        operator: bool = False,
        credentials_path: Path | None = None,
        timeout: float = TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
        http: httpx.Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        target = resolve_target(server, token, operator=operator, credentials_path=credentials_path)
        self.server, self.token = target.server, target.token
        self._sleep = sleep
        self._http = http or httpx.Client(
            base_url=self.server + API_PREFIX,
            headers=_headers(self.token),
            timeout=timeout,
            transport=transport,
        )
        self.tasks = Tasks[JSON, Iterator[JSON], Iterator[str]](self)
        self.groups = Groups[JSON, Iterator[JSON], Iterator[str]](self)
        self.jobs = Jobs[JSON, Iterator[JSON], Iterator[str]](self)
        self.queues = Queues[JSON, Iterator[JSON], Iterator[str]](self)
        self.pools = Pools[JSON, Iterator[JSON], Iterator[str]](self)
        self.nodes = Nodes[JSON, Iterator[JSON], Iterator[str]](self)
        self.tenants = Tenants[JSON, Iterator[JSON], Iterator[str]](self)

    def send(
        self,
        method: str,
        path: str,
        *,
        body: Body = None,
        params: Mapping[str, Any] | None = None,
    ) -> httpx.Response:
        """One call: retried on 429/503 with Retry-After when `method` is idempotent; a
        refusal raises `ApiError`, no answer `Unreachable`."""
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    method, path, params=clean_params(params), json=body_of(body)
                )
            except httpx.HTTPError as exc:
                raise Unreachable(self.server, str(exc) or type(exc).__name__) from None
            if response.status_code < 400:
                return response
            wait = retry_wait(method, response, attempt)
            if wait is None:
                raise api_error(response)
            self._sleep(wait)
            attempt += 1

    def request(
        self, method: str, path: str, *, body: Body = None, params: Mapping[str, Any] | None = None
    ) -> JSON:
        """`send`, answered as the JSON object."""
        return _json(self.send(method, path, body=body, params=params))

    def pages(self, path: str, key: str, paged: bool, params: dict[str, Any]) -> Iterator[JSON]:
        if not paged:
            yield from self.request("GET", path, params=params).get(key) or []
            return
        page = _first_page(params)
        while True:
            items, more = page_items(self.request("GET", path, params=params | {"page": page}), key)
            yield from items
            if not more:
                return
            page += 1

    def events(self, path: str, **params: Any) -> Iterator[SseEvent]:
        """Follow a Server-Sent Events route; a refusal before the stream starts raises
        (retried as `send` retries a GET)."""
        attempt = 0
        while True:
            try:
                with self._http.stream(
                    "GET", path, params=clean_params(params), timeout=STREAM_TIMEOUT
                ) as response:
                    if response.status_code < 400:
                        yield from parse_sse(response.iter_lines())
                        return
                    response.read()
            except httpx.HTTPError as exc:
                raise Unreachable(self.server, str(exc) or type(exc).__name__) from None
            wait = retry_wait("GET", response, attempt)
            if wait is None:
                raise api_error(response)
            self._sleep(wait)
            attempt += 1

    def lines(self, path: str, params: dict[str, Any]) -> Iterator[str]:
        for event in self.events(path, **params):
            line = _line_of(event)
            if line is None:
                return
            yield line

    def serve(
        self, target_id: str, path: str = "", method: str = "POST", **kwargs: Any
    ) -> httpx.Response:
        """A request to an inference task or group through the gateway's router
        (`/serve/{target_id}/{path}`), answered as the replica answers; `kwargs` go to httpx
        (`json=`, `content=`, `headers=`). Not retried; an error status is not raised."""
        url = f"{self.server}/serve/{seg(target_id)}/{path.lstrip('/')}"
        try:
            return self._http.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            raise Unreachable(self.server, str(exc) or type(exc).__name__) from None

    def ready(self) -> JSON:
        """`GET /readyz`: the gateway and what it depends on answer (a 503 raises)."""
        return self.request("GET", f"{self.server}/readyz")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


AJSON = Awaitable[JSON]


class AsyncClient:
    """The asyncio twin of `Client` (same resolution of server and token, same resources;
    their calls are awaited, their iterators are `async for`)."""

    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        *,
        operator: bool = False,
        credentials_path: Path | None = None,
        timeout: float = TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
        http: httpx.AsyncClient | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        target = resolve_target(server, token, operator=operator, credentials_path=credentials_path)
        self.server, self.token = target.server, target.token
        self._sleep = sleep
        self._http = http or httpx.AsyncClient(
            base_url=self.server + API_PREFIX,
            headers=_headers(self.token),
            timeout=timeout,
            transport=transport,
        )
        self.tasks = Tasks[AJSON, AsyncIterator[JSON], AsyncIterator[str]](self)
        self.groups = Groups[AJSON, AsyncIterator[JSON], AsyncIterator[str]](self)
        self.jobs = Jobs[AJSON, AsyncIterator[JSON], AsyncIterator[str]](self)
        self.queues = Queues[AJSON, AsyncIterator[JSON], AsyncIterator[str]](self)
        self.pools = Pools[AJSON, AsyncIterator[JSON], AsyncIterator[str]](self)
        self.nodes = Nodes[AJSON, AsyncIterator[JSON], AsyncIterator[str]](self)
        self.tenants = Tenants[AJSON, AsyncIterator[JSON], AsyncIterator[str]](self)

    async def send(
        self,
        method: str,
        path: str,
        *,
        body: Body = None,
        params: Mapping[str, Any] | None = None,
    ) -> httpx.Response:
        attempt = 0
        while True:
            try:
                response = await self._http.request(
                    method, path, params=clean_params(params), json=body_of(body)
                )
            except httpx.HTTPError as exc:
                raise Unreachable(self.server, str(exc) or type(exc).__name__) from None
            if response.status_code < 400:
                return response
            wait = retry_wait(method, response, attempt)
            if wait is None:
                raise api_error(response)
            await self._sleep(wait)
            attempt += 1

    async def request(
        self, method: str, path: str, *, body: Body = None, params: Mapping[str, Any] | None = None
    ) -> JSON:
        return _json(await self.send(method, path, body=body, params=params))

    async def pages(
        self, path: str, key: str, paged: bool, params: dict[str, Any]
    ) -> AsyncIterator[JSON]:
        if not paged:
            for item in (await self.request("GET", path, params=params)).get(key) or []:
                yield item
            return
        page = _first_page(params)
        while True:
            data = await self.request("GET", path, params=params | {"page": page})
            items, more = page_items(data, key)
            for item in items:
                yield item
            if not more:
                return
            page += 1

    async def events(self, path: str, **params: Any) -> AsyncIterator[SseEvent]:
        attempt = 0
        while True:
            try:
                async with self._http.stream(
                    "GET", path, params=clean_params(params), timeout=STREAM_TIMEOUT
                ) as response:
                    if response.status_code < 400:
                        parser = SseParser()
                        async for line in response.aiter_lines():
                            if (event := parser.feed(line)) is not None:
                                yield event
                        if parser.data:
                            yield SseEvent(parser.event, "\n".join(parser.data))
                        return
                    await response.aread()
            except httpx.HTTPError as exc:
                raise Unreachable(self.server, str(exc) or type(exc).__name__) from None
            wait = retry_wait("GET", response, attempt)
            if wait is None:
                raise api_error(response)
            await self._sleep(wait)
            attempt += 1

    async def lines(self, path: str, params: dict[str, Any]) -> AsyncIterator[str]:
        async for event in self.events(path, **params):
            line = _line_of(event)
            if line is None:
                return
            yield line

    async def serve(
        self, target_id: str, path: str = "", method: str = "POST", **kwargs: Any
    ) -> httpx.Response:
        url = f"{self.server}/serve/{seg(target_id)}/{path.lstrip('/')}"
        try:
            return await self._http.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            raise Unreachable(self.server, str(exc) or type(exc).__name__) from None

    async def ready(self) -> JSON:
        return await self.request("GET", f"{self.server}/readyz")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()
