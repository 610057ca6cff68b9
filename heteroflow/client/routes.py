"""The API's routes, once for both clients.

Each resource method names a route and returns what its client's call returns: a dict for
`Client`, an awaitable of one for `AsyncClient` (`R`); lists walked page after page are an
iterator of dicts (`I`), followed logs an iterator of lines (`L`), each sync or async too.
The gateway's routes are in services/api_gateway/routes_*.py; docs/client.md maps them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import quote

from pydantic import BaseModel

Body = BaseModel | Mapping[str, Any] | None

R = TypeVar("R", covariant=True)
I = TypeVar("I", covariant=True)  # noqa: E741
L = TypeVar("L", covariant=True)


class Caller(Protocol[R, I, L]):
    """What a resource asks of its client."""

    def request(
        self, method: str, path: str, *, body: Body = None, params: Mapping[str, Any] | None = None
    ) -> R: ...

    def pages(self, path: str, key: str, paged: bool, params: dict[str, Any]) -> I: ...

    def lines(self, path: str, params: dict[str, Any]) -> L: ...


def seg(ident: str) -> str:
    """One path segment (an id or a name), quoted."""
    return quote(str(ident), safe="")


class _Routes(Generic[R, I, L]):
    path = ""
    key = ""
    paged = True

    def __init__(self, client: Caller[R, I, L]) -> None:
        self._c = client

    def _at(self, ident: str, *rest: str) -> str:
        return "/".join((self.path, seg(ident), *rest))

    def _post(self, path: str, body: Body = None, **params: Any) -> R:
        return self._c.request("POST", path, body=body, params=params)


class Resource(_Routes[R, I, L]):
    """Create, read, list, update, delete and POST verbs of one kind."""

    def create(self, body: Body, **params: Any) -> R:
        """`POST /{kind}`; an operator adds `tenant_id=`."""
        return self._post(self.path, body, **params)

    def get(self, ident: str, **params: Any) -> R:
        return self._c.request("GET", self._at(ident), params=params)

    def list(self, **params: Any) -> R:
        """One page as the API answers it (`{key: [...], total, page, per_page}`)."""
        return self._c.request("GET", self.path, params=params)

    def iter(self, **params: Any) -> I:
        """Every item, page after page (`per_page` 100 unless given)."""
        return self._c.pages(self.path, self.key, self.paged, dict(params))

    def update(self, ident: str, body: Body) -> R:
        return self._c.request("PUT", self._at(ident), body=body)

    def delete(self, ident: str) -> R:
        return self._c.request("DELETE", self._at(ident))

    def plan(self, body: Body, **params: Any) -> R:
        """`POST /{kind}/plan` (tasks, groups, jobs): what the create would do with `body`
        now (each node's verdict, preemptions, admission), writing nothing."""
        return self._post(f"{self.path}/plan", body, **params)

    def action(self, ident: str, verb: str, body: Body = None, **params: Any) -> R:
        """`POST {path}/{ident}/{verb}` (verb may have several segments: `rollout/pause`)."""
        return self._post(self._at(ident, verb), body, **params)


class _Timeline(Resource[R, I, L]):
    """Kinds with a paged timeline (`GET /{kind}/{id}/events`) and a stats route."""

    def stats(self) -> R:
        """`GET /{kind}/stats`: live ones by status."""
        return self._c.request("GET", f"{self.path}/stats")

    def events(self, ident: str, **params: Any) -> R:
        """One page of the timeline, newest first (`page`, `per_page`)."""
        return self._c.request("GET", self._at(ident, "events"), params=params)

    def iter_events(self, ident: str, **params: Any) -> I:
        """The whole timeline, newest first, page after page."""
        return self._c.pages(self._at(ident, "events"), "events", True, dict(params))

    def serving(self, ident: str) -> R:
        """Replicas, readiness and the router's figures of an inference task or group."""
        return self._c.request("GET", self._at(ident, "serving"))

    def gpu_metrics(self, ident: str, **params: Any) -> R:
        """GPU samples of a task or a group's members (`start`, `end`, `step` s)."""
        return self._c.request("GET", self._at(ident, "gpu-metrics"), params=params)

    def energy(self, ident: str, **params: Any) -> R:
        return self._c.request("GET", self._at(ident, "energy"), params=params)

    def stop(self, ident: str) -> R:
        return self.action(ident, "stop")

    def sleep(self, ident: str) -> R:
        return self.action(ident, "sleep")

    def wake(self, ident: str) -> R:
        return self.action(ident, "wake")


class Tasks(_Timeline[R, I, L]):
    path, key = "/tasks", "tasks"

    def retries(self, ident: str) -> R:
        """The attempts and the retry engine's decision on each."""
        return self._c.request("GET", self._at(ident, "retries"))

    def logs(self, ident: str, lines: int | None = None) -> R:
        """The last `lines` lines (`{"task_id", "logs": [...]}`)."""
        return self._c.request("GET", self._at(ident, "logs"), params={"lines": lines})

    def follow_logs(self, ident: str, lines: int | None = None) -> L:
        """The last `lines` lines, then each new line as it comes, until the task ends."""
        params: dict[str, Any] = {"follow": "true", "lines": lines}
        return self._c.lines(self._at(ident, "logs"), params)


class Groups(_Timeline[R, I, L]):
    path, key = "/task-groups", "groups"

    def scale(self, ident: str, replicas: int) -> R:
        return self.action(ident, "scale", {"replicas": replicas})

    def autoscale(self, ident: str, auto_scale: Body) -> R:
        """Set the group's `auto_scale` (None removes it)."""
        return self.update(ident, {"auto_scale": _plain(auto_scale)})

    def window(self, ident: str, schedule_window: Body) -> R:
        """Set the group's `schedule_window` (None removes it)."""
        return self.update(ident, {"schedule_window": _plain(schedule_window)})

    def rollout(self, ident: str, body: Body) -> R:
        """Start a rollout: a `RolloutRequest` (libs/domain/rollout/model.py: `image`, `env`,
        `volumes`, `max_surge`, `max_unavailable`, ...) or its mapping."""
        return self.action(ident, "rollout", body)

    def rollout_status(self, ident: str) -> R:
        return self._c.request("GET", self._at(ident, "rollout"))

    def pause_rollout(self, ident: str) -> R:
        return self.action(ident, "rollout/pause")

    def resume_rollout(self, ident: str) -> R:
        return self.action(ident, "rollout/resume")

    def rollback(self, ident: str) -> R:
        return self.action(ident, "rollout/rollback")


class Jobs(Resource[R, I, L]):
    path, key = "/jobs", "jobs"

    def stop(self, ident: str) -> R:
        return self.action(ident, "stop")

    def events(self, ident: str) -> R:
        """The job's own events, oldest first (`{"events": [...]}`, not paged)."""
        return self._c.request("GET", self._at(ident, "events"))


class Queues(Resource[R, I, L]):
    path, key, paged = "/queues", "queues", False


class Pools(Resource[R, I, L]):
    path, key, paged = "/pools", "pools", False


class Nodes(_Routes[R, I, L]):
    """Operator routes: nodes, their agent keys and join tokens."""

    path = "/nodes"

    def list(self) -> R:
        """`{"nodes": [...]}`: every node with its inventory and status."""
        return self._c.request("GET", self.path)

    def get(self, node_id: str, **params: Any) -> R:
        """One node (`as_of=` an RFC 3339 time: as it was then)."""
        return self._c.request("GET", self._at(node_id), params=params)

    def events(self, node_id: str, **params: Any) -> R:
        """One page of the node's timeline, newest first (`page`, `per_page`)."""
        return self._c.request("GET", self._at(node_id, "events"), params=params)

    def iter_events(self, node_id: str, **params: Any) -> I:
        """The node's whole timeline, newest first, page after page."""
        return self._c.pages(self._at(node_id, "events"), "events", True, dict(params))

    def uncordon_card(self, node_id: str, gpu_id: str) -> R:
        """Return a quarantined card to placement now."""
        return self._post(self._at(node_id, "gpus", seg(gpu_id), "uncordon"))

    def quarantine_card(self, node_id: str, gpu_id: str, reason: str | None = None) -> R:
        """Take a card out of placement by hand."""
        body = {"reason": reason} if reason is not None else {}
        return self._post(self._at(node_id, "gpus", seg(gpu_id), "quarantine"), body)

    def register(self, node_id: str) -> R:
        """Issue `node_id`'s agent key (a previous key stops working)."""
        return self._post(self._at(node_id, "credentials"))

    def join_token(self, ttl_s: int | None = None) -> R:
        return self._post(f"{self.path}/join-tokens", ttl_s=ttl_s)

    def join(self, node_id: str) -> R:
        """Register `node_id` with a join token: the client's token must be that token."""
        return self._post(self._at(node_id, "join"))


class Tenants(_Routes[R, I, L]):
    """Operator routes: tenants, their API keys and user tokens."""

    path = "/tenants"

    def create(self, body: Body) -> R:
        """`{"id", "name"?, "gpu_quota"?}` (services/api_gateway/schemas.py TenantCreate)."""
        return self._post(self.path, body)

    def list(self) -> R:
        return self._c.request("GET", self.path)

    def update(self, tenant_id: str, body: Body) -> R:
        """`{"suspended"?, "gpu_quota"?}` (TenantUpdate)."""
        return self._c.request("PUT", self._at(tenant_id), body=body)

    def create_api_key(self, tenant_id: str, name: str | None = None) -> R:
        body = {"name": name} if name is not None else {}
        return self._post(self._at(tenant_id, "api-keys"), body)

    def api_keys(self, tenant_id: str) -> R:
        return self._c.request("GET", self._at(tenant_id, "api-keys"))

    def create_token(self, tenant_id: str, subject: str, ttl_seconds: int | None = None) -> R:
        body: dict[str, Any] = {"subject": subject}
        if ttl_seconds is not None:
            body["ttl_seconds"] = ttl_seconds
        return self._post(self._at(tenant_id, "tokens"), body)


def _plain(body: Body) -> Any:
    if isinstance(body, BaseModel):
        return body.model_dump(mode="json", exclude_unset=True)
    return None if body is None else dict(body)
