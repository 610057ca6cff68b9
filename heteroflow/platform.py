"""`heteroflow up`: the whole platform on one machine.

With no URLs configured it starts an embedded NATS server and an embedded PostgreSQL under
the state directory, then every service of heteroflow/services.py in this process, or, with
`--processes` (HETEROFLOW_PROCESSES=true), each service and the local agent as a supervised
child process (heteroflow/processes.py). On first start it creates an operator token, an
agent key and a `default` tenant with an API key, and writes them to `credentials.json`
(mode 0600). Data survive a restart; SIGINT/SIGTERM stop everything.

Embedded servers: one `up` per state directory (`up.lock`); orphans of a previous `up` that
was killed are stopped before anything starts (libs/pidfile.py), the servers are restarted
when they die while `up` runs (libs/server_supervisor.py), and stopped on every way out of
`serve` but SIGKILL (whose orphans the next start stops).

Health loop (`run_health`): every HEALTH_INTERVAL_S a write probe (libs/bus/writes.py)
publishes to JetStream; its cause is the `jetstream_writes` readiness report (the gateway's
`/readyz`), and the embedded nats-server is ended and started again by the supervisor when
its writes have been refused for a while and the disk has room again (a JetStream store that
met a write error refuses writes until the server restarts; while the disk is still below the
threshold a restart would not help, and the gateway sheds writes meanwhile).

Bus keeper (`run_bus_keeper`): every BUS_CHECK_S the streams and the lease bucket are looked
up, and declared again when the server has lost them (a JetStream store lost under `up`), the
bucket's revisions above the newest fence so that leaders are not refused; the consumers are
declared again by their own processes (libs/bus/pull.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats.errors
import structlog
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings

from agent.service import AgentSettings
from heteroflow.node import serve_agent
from heteroflow.processes import Supervisor, children
from heteroflow.services import SERVICES, by_name, lease_ttl_s, names, nats_users
from libs import auth
from libs.bus.lease import open_lease_bucket
from libs.bus.nats import configured_replicas, connect, ensure_streams, stream_configs
from libs.bus.subjects import LEASE_BUCKET
from libs.bus.writes import WriteProbe
from libs.config import GatewaySettings
from libs.diskspace import DiskSpace
from libs.embedded import EmbeddedNats, EmbeddedPostgres, saved_or_free_port
from libs.health import READINESS
from libs.installation import installation_id
from libs.looplag import LoopLagMonitor
from libs.periodic import periodic
from libs.pidfile import UpLock
from libs.server_supervisor import HealthCheck, Server, ServerSupervisor
from libs.service import ServiceContext, ServiceSpec
from libs.store import fencing, tenants
from libs.store.eventstore import EventStore
from services.api_gateway import service as gateway_service

log = structlog.get_logger(__name__)

NODE_LOGIN_SYNC_S = 1.0
HEALTH_INTERVAL_S = 1.0
BUS_CHECK_S = 2.0

ServiceRunner = Callable[["Platform", asyncio.Event], Coroutine[Any, Any, None]]


class PlatformSettings(GatewaySettings):
    """Settings of `heteroflow up` (prefix HETEROFLOW_)."""

    nats_port: int = Field(default=0, description="embedded NATS port; 0 = 4222 if free")
    local_agent: bool = Field(default=True, description="start one agent for this machine")
    processes: bool = Field(
        default=False, description="run each service and the local agent as a child process"
    )
    rollout_in_up: bool = Field(
        default=True,
        description="run the rollout controller in `up` (false: `heteroflow service rollout` "
        "runs it elsewhere)",
    )
    embedded_restart_backoff_s: float = Field(
        default=1.0,
        gt=0,
        description="wait before an embedded server that died is started again (doubles to 30 s)",
    )
    embedded_unhealthy_after_s: float = Field(
        default=5.0,
        gt=0,
        description="an embedded server whose health check fails this long is ended and "
        "started again",
    )


@dataclass
class Platform:
    settings: PlatformSettings
    nats_url: str = ""
    database_url: str = ""
    store: EventStore | None = None
    credentials: dict[str, str] = field(default_factory=dict)
    _nats: EmbeddedNats | None = None
    _pg: EmbeddedPostgres | None = None
    writes: WriteProbe | None = None  # the health loop's, while it runs
    disk: DiskSpace = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        self.disk = DiskSpace(s.home, s.disk_min_free_mb, s.disk_min_free_percent)

    @property
    def home(self) -> Path:
        return self.settings.home

    def writes_cause(self) -> str | None:
        """Why JetStream writes fail (the write probe's answer, with the embedded server's
        last logged error); None while they are acknowledged."""
        if self.writes is None:
            return "the write probe is not running"
        cause = self.writes.cause
        if cause and self.writes.refused and self._nats:
            said = self._nats.last_error()
            if said:
                cause = f"{cause}; nats-server last logged: {said}"
        return cause

    def nats_broken(self) -> str | None:
        """The supervisor's health check of the embedded nats-server: why to restart it (its
        writes refused while connected, and the disk has room again), else None."""
        if self.writes is None or not self.writes.refused:
            return None
        if self.disk.cause() is not None:
            return None  # still full: a restart cannot help, and writes are shed meanwhile
        return self.writes_cause()

    def url_for(self, user: str) -> str:
        """The NATS URL a service logs in with: its own user on the embedded server; the
        configured URL (whatever it grants) with external NATS."""
        return self._nats.url_for(user) if self._nats else self.nats_url

    def agent_login(self) -> tuple[str, SecretStr | None]:
        """(URL, agent key) for the local agent: the key is its NATS password on the embedded
        server; with external NATS the configured URL carries the login."""
        if self._nats:
            return self._nats.plain_url, SecretStr(self.credentials["agent_token"])
        return self.nats_url, None

    async def declare_bus(self) -> None:
        """Streams and the lease bucket, declared as the admin: service and agent users may
        not administer streams (libs/bus/permissions.py)."""
        nc = await connect(self.nats_url, "heteroflow-up")
        try:
            await self.declare_on(nc.jetstream())
        finally:
            await nc.drain()

    async def declare_on(self, js: JetStreamContext) -> None:
        """`declare_bus` on a connection the caller holds. The bucket's revisions (the
        fencing tokens) are kept above every fence the database holds, as after a lost
        JetStream store (libs/bus/lease.py `raise_revisions`)."""
        floor = await self.fence_floor()
        await ensure_streams(js)
        await open_lease_bucket(js, lease_ttl_s(), floor=floor)

    async def fence_floor(self) -> int:
        """The newest fencing token of any lease (0 without a store)."""
        if self.store is None:
            return 0
        async with self.store.pool.connection() as conn:
            return await fencing.newest_of_all(conn)

    async def bus_missing(self, js: JetStreamContext) -> list[str]:
        """The streams (the lease bucket's included) the server does not have, and the
        bucket when its revisions are behind the fences: what `declare_on` would make."""
        missing: list[str] = []
        for name in [c.name or "" for c in stream_configs()]:
            try:
                await js.stream_info(name)
            except NotFoundError:
                missing.append(name)
        bucket = f"KV_{LEASE_BUCKET}"
        try:
            info = await js.stream_info(bucket)
        except NotFoundError:
            missing.append(bucket)
        else:
            if info.state.last_seq < await self.fence_floor():
                missing.append(f"{bucket} (revisions behind the fences)")
        return missing

    async def sync_node_logins(self) -> None:
        """Let exactly the registered nodes log in to the embedded NATS server."""
        if self._nats is None or self.store is None:
            return
        logins = await tenants.node_logins(self.store)
        await asyncio.to_thread(
            self._nats.set_nodes, {n.node_id: n.nats_password_hash for n in logins}
        )

    def start_servers(self) -> None:
        """Resolve the configured URLs, or start the embedded servers (after stopping the
        orphans a killed `up` left on their stores). Stops what it started if one fails."""
        self.home.mkdir(parents=True, exist_ok=True)
        installation_id(self.home)  # made once, before any agent it starts reads it
        s = self.settings
        try:
            if s.nats_url:
                self.nats_url = s.nats_url.get_secret_value()
            else:
                self._nats = EmbeddedNats(self.home / "nats", services=nats_users())
                self._nats.stop_orphans()  # an orphan may hold the saved port
                port_file = self.home / "nats" / "port"
                self._nats.port = s.nats_port or saved_or_free_port(port_file, 4222)
                self.nats_url = self._nats.start().url
            if s.database_url:
                self.database_url = s.database_url.get_secret_value()
            else:
                self._pg = EmbeddedPostgres(self.home / "postgres")
                self.database_url = self._pg.start().url
        except BaseException:
            self.stop_servers()
            raise

    def health_checks(self) -> dict[str, HealthCheck]:
        if self._nats is None:
            return {}
        return {"nats-server": HealthCheck(self.nats_broken, self._nats.terminate)}

    def embedded_servers(self) -> dict[str, Server]:
        servers: dict[str, Server] = {}
        if self._nats:
            servers["nats-server"] = self._nats
        if self._pg:
            servers["postgres"] = self._pg
        return servers

    def server_supervisor(self) -> ServerSupervisor:
        """What restarts the embedded servers that died or stopped answering, on the
        settings' bounds."""
        return ServerSupervisor(
            self.embedded_servers(),
            first_backoff_s=self.settings.embedded_restart_backoff_s,
            unhealthy_after_s=self.settings.embedded_unhealthy_after_s,
            health=self.health_checks(),
        )

    def stop_servers(self) -> None:
        if self._nats:
            self._nats.stop()
        if self._pg:
            self._pg.stop()

    def jwt_secret(self) -> SecretStr:
        return gateway_service.jwt_secret(self.settings)

    async def bootstrap(self) -> dict[str, str]:
        """Create first credentials once; later starts reuse credentials.json."""
        assert self.store is not None
        path = self.home / "credentials.json"
        url = f"http://{self.settings.host}:{self.settings.port}"
        have_operator = await tenants.has_operator(self.store)
        if have_operator and path.exists():
            creds: dict[str, str] = json.loads(path.read_text())
            creds["url"] = url
        else:
            if await tenants.get_tenant(self.store, "default") is None:
                await auth.create_tenant(self.store, "default", "default")
            _, tenant_key = await auth.issue_api_key(self.store, "default", "local")
            creds = {
                "operator_token": await auth.issue_system_credential(
                    self.store, "operator", "local operator"
                ),
                "tenant_api_key": tenant_key,
                "tenant_id": "default",
                "url": url,
            }
        if self.settings.local_agent:
            await self._local_node_credential(creds)
        _write_private(path, json.dumps(creds, indent=2) + "\n")
        self.credentials = creds
        return creds

    async def _local_node_credential(self, creds: dict[str, str]) -> None:
        """The local agent's key, bound to its node id: issued on first start, and again when
        the node id changed or the key in credentials.json is an old unbound one."""
        assert self.store is not None
        node_id = AgentSettings().node_id
        live = await tenants.node_credential(self.store, node_id)
        token = creds.get("agent_token", "")
        if live is None or creds.get("agent_node_id") != node_id or not token:
            creds["agent_token"] = await auth.issue_node_credential(self.store, node_id)
            creds["agent_node_id"] = node_id


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    path.chmod(0o600)


async def run_node_logins(platform: Platform, stop: asyncio.Event) -> None:
    """Keep the embedded NATS server's node users in step with the registered nodes: a node
    registered through the API can log in within NODE_LOGIN_SYNC_S."""
    if platform._nats is None:
        await stop.wait()  # external NATS: its users are the operator's; `up` lives on
        return
    await periodic("node_logins", platform.sync_node_logins, stop, NODE_LOGIN_SYNC_S)


async def run_bus_keeper(platform: Platform, stop: asyncio.Event) -> None:
    """Every BUS_CHECK_S, as the admin: when the server has lost a stream or the lease
    bucket (a JetStream store lost under a running `up`, an external NATS started empty),
    declare them again (`declare_on`, the bucket above the fences). The consumers are
    declared again by their own processes once the server says they are gone
    (libs/bus/pull.py)."""
    nc = await connect(platform.nats_url, "heteroflow-up-bus")
    js = nc.jetstream()

    async def once() -> None:
        try:
            missing = await platform.bus_missing(js)
        except (nats.errors.Error, OSError) as exc:  # the server is away: the next round
            log.debug("bus_check_failed", error=repr(exc))
            return
        if missing:
            log.warning("bus_declared_again", missing=missing)
            await platform.declare_on(js)

    try:
        await periodic("bus_keeper", once, stop, BUS_CHECK_S)
    finally:
        await nc.close()


async def run_health(platform: Platform, stop: asyncio.Event) -> None:
    """Probe JetStream writes every HEALTH_INTERVAL_S, as the admin, on a connection of its
    own: the `jetstream_writes` readiness report and the supervisor's nats-server check."""
    nc = await connect(platform.nats_url, "heteroflow-up-health")
    probe = WriteProbe(nc, "up", replicas=configured_replicas())
    platform.writes = probe
    READINESS.report("jetstream_writes", platform.writes_cause)

    async def once() -> None:
        await probe.probe()
        platform.disk.read()  # keeps the free-space gauges current without requests

    try:
        await periodic("health", once, stop, HEALTH_INTERVAL_S)
    finally:
        READINESS.withdraw("jetstream_writes")
        platform.writes = None
        await nc.close()


def service_settings(spec: ServiceSpec, settings: PlatformSettings) -> BaseSettings:
    """The settings a service runs with: read from the environment, or the platform's own
    when they extend the service's class (the api-gateway's: `up`'s host, port, secrets)."""
    return settings if isinstance(settings, spec.Settings) else spec.Settings()


def service_runner(spec: ServiceSpec) -> ServiceRunner:
    """A runner of `spec` in this process: its own store pool and NATS login, as its user."""

    async def run(platform: Platform, stop: asyncio.Event) -> None:
        settings = service_settings(spec, platform.settings)
        ctx = await ServiceContext.open(
            platform.database_url,
            platform.url_for(spec.nats_user.name),
            spec.name,
            pool_max=spec.pool_max(settings),
        )
        READINESS.require(f"{spec.name}: nats connected", lambda: ctx.nc.is_connected)
        try:
            await spec.run(ctx, stop, settings)
        finally:
            await ctx.close()

    run.__name__ = f"run_{spec.name.replace('-', '_')}"
    return run


async def run_local_agent(platform: Platform, stop: asyncio.Event) -> None:
    url, key = platform.agent_login()
    await serve_agent(AgentSettings(agent_token=key), url, stop)


def banner(creds: dict[str, str], home: Path) -> str:
    url = creds["url"]
    return (
        f"\nHeteroFlow is up at {url}\n"
        f"Credentials: {home / 'credentials.json'} (operator_token, tenant_api_key, agent_token)\n"
        f"Register another node: POST {url}/api/v1/nodes/<node id>/credentials (operator)\n"
        "Try it:\n"
        '  export HF_KEY=$(python3 -c "import json;'
        f"print(json.load(open('{home}/credentials.json'))['tenant_api_key'])\")\n"
        f'  curl -s -X POST {url}/api/v1/tasks -H "Authorization: Bearer $HF_KEY" '
        "-H 'Content-Type: application/json' "
        '-d \'{"name": "hello", "image": "busybox:latest", "command": "echo hello"}\'\n'
        f'  curl -s {url}/api/v1/tasks -H "Authorization: Bearer $HF_KEY"\n'
        "Stop with Ctrl-C.\n"
    )


async def supervised(runner: ServiceRunner, platform: Platform, stop: asyncio.Event) -> None:
    """Run a service until stop; if it fails, log it and start it again (like a process
    supervisor would), so one service's bug does not take the platform down."""
    delay = 1.0
    while not stop.is_set():
        try:
            await runner(platform, stop)
            return
        except Exception:
            log.exception("service_failed_restarting", service=runner.__name__, in_s=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            delay = min(delay * 2, 30.0)


async def serve(
    settings: PlatformSettings,
    ready: Callable[[dict[str, str]], Any] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    platform = Platform(settings)
    embedded = not (settings.nats_url and settings.database_url)
    lock = UpLock(settings.home).acquire() if embedded else None  # StoreInUse if one runs
    lag = LoopLagMonitor(name="platform").start()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    # Before the servers start: a SIGTERM during their start must still stop them.
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    watch: asyncio.Task[None] | None = None
    try:
        await asyncio.to_thread(platform.start_servers)
        if stop.is_set():
            return
        servers = platform.server_supervisor()
        watch = asyncio.create_task(servers.run(stop))
        # For the credentials bootstrap and the node-login sync: every service, the gateway
        # included, opens a pool of its own.
        platform.store = await EventStore.open(platform.database_url, max_size=2)
        await _serve_services(platform, stop, ready)
    finally:
        stop.set()
        if watch is not None:  # no restart may race the stop below
            await asyncio.gather(watch, return_exceptions=True)
        if platform.store:
            await platform.store.close()
        await asyncio.to_thread(platform.stop_servers)
        if lock is not None:
            lock.release()
        lag.stop()
        log.info("platform_stopped", max_event_loop_lag_s=round(lag.max_lag_s, 3))


async def _serve_services(
    platform: Platform,
    stop: asyncio.Event,
    ready: Callable[[dict[str, str]], Any] | None,
) -> None:
    settings = platform.settings
    creds = await platform.bootstrap()
    await platform.declare_bus()
    await platform.sync_node_logins()  # before the local agent logs in
    if settings.processes:
        await _serve_processes(platform, creds, stop, ready)
        return
    runners: list[ServiceRunner] = [run_node_logins, run_health, run_bus_keeper]
    for spec in SERVICES:
        if spec.up_flag is None or getattr(settings, spec.up_flag):
            runners.append(service_runner(spec))
    if settings.local_agent:
        runners.append(run_local_agent)
    tasks = [asyncio.create_task(supervised(r, platform, stop)) for r in runners]
    print(banner(creds, platform.home), flush=True)
    if ready:
        ready(creds)
    done, _ = await asyncio.wait(
        [asyncio.create_task(stop.wait()), *tasks], return_when=asyncio.FIRST_COMPLETED
    )
    for t in done:
        if t in tasks and t.exception():
            log.error("service_failed", error=repr(t.exception()))
    stop.set()
    await _stopped(tasks, [r.__name__ for r in runners])


# How long the services have to end once told to stop. Past it the ones still running are
# named in the log and cancelled, so the store and the embedded servers still close in order
# (and a supervisor's stop timeout is not spent waiting on one service).
SERVICES_STOP_S = 20.0


def waiting_tasks() -> list[str]:
    """Where each task of the loop still running is suspended: its innermost awaited
    coroutine's `file:line (function)`, for the log of a stop that is overdue."""
    where: list[str] = []
    for task in asyncio.all_tasks():
        if task is asyncio.current_task():
            continue
        coro: Any = task.get_coro()
        frame = None
        while coro is not None and getattr(coro, "cr_frame", None) is not None:
            frame = coro.cr_frame
            coro = getattr(coro, "cr_await", None)
        if frame is not None:
            code = frame.f_code
            where.append(f"{task.get_name()}: {code.co_filename}:{frame.f_lineno} ({code.co_name})")
    return sorted(where)


async def _stopped(tasks: list[asyncio.Task[None]], names: list[str]) -> None:
    done, late = await asyncio.wait(tasks, timeout=SERVICES_STOP_S)
    if late:
        log.warning(
            "services_stop_overdue",
            services=[n for n, t in zip(names, tasks, strict=True) if t in late],
            after_s=SERVICES_STOP_S,
            waiting=waiting_tasks(),
        )
        for t in late:
            t.cancel()
        await asyncio.wait(late, timeout=5.0)
    for t in done:
        if not t.cancelled() and t.exception() is not None:
            log.error("service_failed_stopping", error=repr(t.exception()))


async def _serve_processes(
    platform: Platform,
    creds: dict[str, str],
    stop: asyncio.Event,
    ready: Callable[[dict[str, str]], Any] | None,
) -> None:
    """The services and the local agent as supervised child processes (heteroflow/processes)."""
    platform.jwt_secret()  # created once here, read from the state directory by the gateway
    env = os.environ | {
        "HETEROFLOW_HOME": str(platform.home),
        "HETEROFLOW_NATS_URL": platform.nats_url,
        "HETEROFLOW_DATABASE_URL": platform.database_url,
    }
    kids = children(env, names(), agent=platform.settings.local_agent)
    for kid in kids:  # each logs in to NATS as itself
        if kid.name == "agent":
            url, key = platform.agent_login()
            kid.env = kid.env | {"HETEROFLOW_NATS_URL": url}
            if key is not None:
                kid.env["HETEROFLOW_AGENT_TOKEN"] = key.get_secret_value()
        else:
            user = by_name(kid.name).nats_user.name
            kid.env = kid.env | {"HETEROFLOW_NATS_URL": platform.url_for(user)}
    supervisor = Supervisor(kids, platform.home / "processes.json")
    logins = asyncio.create_task(run_node_logins(platform, stop))
    health = asyncio.create_task(supervised(run_health, platform, stop))
    bus = asyncio.create_task(supervised(run_bus_keeper, platform, stop))
    running = asyncio.create_task(supervisor.run(stop))
    if await supervisor.wait_ready(stop):
        print(banner(creds, platform.home), flush=True)
        if ready:
            ready(creds)
    await running
    await logins
    await health
    await bus
