"""Running one node agent: its NATS login and its life until stopped (`up`'s local agent and
`heteroflow agent` alike)."""

from __future__ import annotations

import asyncio
import contextlib
import os

import httpx
import structlog
from nats.errors import NoRespondersError
from nats.js.errors import NotFoundError
from pydantic import SecretStr

from agent.service import AgentSettings, run_agent
from libs.bus import permissions as perms
from libs.bus.nats import connect, ensure_streams
from libs.health import READINESS

log = structlog.get_logger(__name__)


async def serve_agent(settings: AgentSettings, nats_url: str, stop: asyncio.Event) -> None:
    """One node agent on its own NATS connection until `stop` (`up`'s local agent and
    `heteroflow agent` alike).

    With an agent key and a URL without credentials it logs in as `agent-<node_id>` with the
    key as password (the embedded server's node users); with credentials in the URL (an
    operator's external NATS) it uses those and declares the streams itself, as before.
    """
    node_id = settings.node_id
    login = not _has_userinfo(nats_url) and settings.agent_token is not None
    # The first connect retries (the server may start later, a refused login may be fixed)
    # for up to a minute; a stop meanwhile ends it at once instead of after that minute.
    connecting = asyncio.ensure_future(
        connect(
            nats_url,
            f"agent-{node_id}",
            user=perms.nats_user(node_id) if login else None,
            password=settings.agent_token.get_secret_value() if settings.agent_token else None,
            inbox_prefix=perms.agent_inbox_prefix(node_id) if login else None,
        )
    )
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not connecting.done():
        connecting.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await connecting
        log.info("agent_stopped_before_connecting", node_id=node_id)
        return
    nc = connecting.result()
    READINESS.require("agent: nats connected", lambda: nc.is_connected)
    js = nc.jetstream()
    try:
        if not login:
            await ensure_streams(js)
        while True:
            try:
                await run_agent(settings, nc, js, stop)
                return
            except (NotFoundError, NoRespondersError):
                # The platform has not declared its streams yet: an agent may not.
                log.warning("agent_waiting_for_streams", node_id=node_id)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
                if stop.is_set():
                    return
    finally:
        await nc.drain()


def _has_userinfo(url: str) -> bool:
    return any("@" in u for u in url.split(","))


def agent_key(settings: AgentSettings) -> SecretStr | None:
    """The node's key: configured, kept from an earlier join, or got now by spending the join
    token at HETEROFLOW_SERVER (then kept, 0600, in the state directory for restarts)."""
    if settings.agent_token is not None:
        return settings.agent_token
    kept = settings.resolved_state_dir() / "agent_token"
    if kept.exists():
        return SecretStr(kept.read_text().strip())
    if settings.join_token is None:
        return None
    if not settings.server:
        raise RuntimeError("HETEROFLOW_JOIN_TOKEN needs HETEROFLOW_SERVER (the API's URL)")
    r = httpx.post(
        f"{settings.server.rstrip('/')}/api/v1/nodes/{settings.node_id}/join",
        headers={"Authorization": f"Bearer {settings.join_token.get_secret_value()}"},
        timeout=httpx.Timeout(10.0, connect=5.0),
    )
    if r.status_code != 201:
        raise RuntimeError(f"join refused ({r.status_code}): {r.text}")
    key = str(r.json()["agent_token"])
    kept.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    log.info("agent_joined", node_id=settings.node_id)
    return SecretStr(key)
