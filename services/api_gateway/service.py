"""The api-gateway process: the HTTP API served in this process, or as
HETEROFLOW_GATEWAY_WORKERS processes sharing one port (server.py)."""

from __future__ import annotations

import asyncio
import secrets

from pydantic import SecretStr

from libs.config import GatewaySettings
from libs.health import READINESS
from libs.service import ServiceContext

from .bus import routes
from .server import Workers, fast_loop, serve_here

__all__ = ["GatewaySettings", "fast_loop", "jwt_secret", "pool_max", "routes", "run"]


def jwt_secret(settings: GatewaySettings) -> SecretStr:
    """The configured secret, else the one kept in the state directory (made on first use,
    so the gateways of one `up` sign and check with the same one)."""
    if settings.jwt_secret:
        return settings.jwt_secret
    path = settings.home / "jwt_secret"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(48))
        path.chmod(0o600)
    return SecretStr(path.read_text().strip())


def pool_max(settings: GatewaySettings) -> int:
    return settings.db_pool_max


async def run(ctx: ServiceContext, stop: asyncio.Event, settings: GatewaySettings) -> None:
    settings = settings.model_copy(update={"jwt_secret": jwt_secret(settings)})
    if settings.gateway_workers > 1:
        workers = Workers(settings, ctx.database_url, ctx.nats_url)
        READINESS.require("api-gateway: workers serving", lambda: workers.ready)
        await workers.run(stop)
        return
    listening = asyncio.Event()
    READINESS.require("api-gateway: http listening", listening.is_set)
    await serve_here(settings, ctx.store, ctx.nc, stop, started=listening.set)
