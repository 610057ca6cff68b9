"""The `heteroflow` command: `up` (everything on one machine), `agent` (a node agent) and
`service <name>` (one control-plane service, for deployments that scale them apart), plus the
user commands (`run`, `ps`, `logs`, ...; libs/cli_user, docs/cli.md)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import overload

import httpx

from heteroflow.cli_check import register_check_commands
from heteroflow.cli_ops import OPS, build_ops_parser
from heteroflow.cli_policy import register_policy_commands
from heteroflow.cli_user import register_user_commands
from heteroflow.cli_user.apply import register_file_commands
from heteroflow.settings_help import SettingsHelpParser, agent_settings, up_settings
from libs import collector
from libs.logging import configure


class ServiceNames(Sequence[str]):
    """The names of heteroflow/services.py, read when `service NAME` is parsed or its help
    shown: building the parser for another command imports no service."""

    def _names(self) -> tuple[str, ...]:
        from heteroflow.services import names

        return names()

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())


def _run_until_signal(
    name: str,
    main: Callable[[asyncio.Event], Awaitable[None]],
    probe: tuple[int, Callable[[], Awaitable[list[str]]]] | None = None,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> None:
    """Run `main` until SIGINT/SIGTERM (or, in a child of `up --processes`, until the parent
    is gone), serving the probe port (/readyz, /metrics) meanwhile when one is given."""

    async def runner() -> None:
        import structlog

        from heteroflow.probe import serve_probe
        from heteroflow.processes import watch_parent
        from libs.looplag import watch_loop

        structlog.contextvars.bind_contextvars(process=name)  # names the sender of each line
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        orphan_guard = asyncio.create_task(watch_parent(stop))
        from libs.config import CommonSettings

        port, unmet = probe or (0, _nothing_missing)
        host = CommonSettings().metrics_host if port else "127.0.0.1"
        async with watch_loop(name), serve_probe(port, unmet, host):
            await main(stop)
        orphan_guard.cancel()

    with asyncio.Runner(loop_factory=loop_factory) as loop_runner:
        loop_runner.run(runner())


async def _nothing_missing() -> list[str]:
    return []


# Options that declare the local node's resources: each sets the agent setting it names, so
# `up --processes` children and an in-process agent read the same value.
RESOURCE_OPTIONS = (
    ("--cpus", "HETEROFLOW_NODE_CPU_CORES", int, "CPU cores the node offers (default: detected)"),
    ("--memory-mb", "HETEROFLOW_NODE_MEMORY_MB", int, "memory the node offers in MB"),
    ("--gpus", "HETEROFLOW_DECLARED_GPUS", str, 'declared cards, e.g. "amd:MI300X:196608x2"'),
    ("--labels", "HETEROFLOW_NODE_LABELS", str, 'node labels as a JSON map, e.g. \'{"zone":"a"}\''),
    ("--runtime", "HETEROFLOW_RUNTIME", str, "auto | docker | process | simulated"),
)


def _add_resource_options(parser: argparse.ArgumentParser) -> None:
    for flag, env, kind, text in RESOURCE_OPTIONS:
        parser.add_argument(flag, type=kind, default=None, help=f"{text} ({env})")


def _apply_resource_options(args: argparse.Namespace) -> None:
    for flag, env, _, _ in RESOURCE_OPTIONS:
        value = getattr(args, flag.lstrip("-").replace("-", "_"), None)
        if value is not None:
            os.environ[env] = str(value)


def _up(args: argparse.Namespace) -> int:
    from heteroflow.platform import PlatformSettings, serve

    _apply_resource_options(args)
    settings = PlatformSettings()
    if args.processes:
        settings.processes = True
    configure(settings.log_level, settings.log_format)
    collector.tune(settings.gc_threshold)
    from libs.pidfile import StoreInUse

    try:
        asyncio.run(serve(settings))
    except StoreInUse as exc:  # another `up`, or a live process, runs on this state directory
        print(f"heteroflow up: {exc}", file=sys.stderr)
        return 1
    return 0


def _agent(args: argparse.Namespace) -> int:
    from agent.service import AgentSettings
    from heteroflow.probe import agent_consumers, readiness

    _apply_resource_options(args)
    settings = AgentSettings()
    configure(settings.log_level, settings.log_format)
    collector.tune(settings.gc_threshold)
    if settings.nats_url is None:
        print("heteroflow agent: set HETEROFLOW_NATS_URL", file=sys.stderr)
        return 2
    url = settings.nats_url.get_secret_value()
    from heteroflow.node import agent_key

    try:
        settings = settings.model_copy(update={"agent_token": agent_key(settings)})
    except (RuntimeError, httpx.HTTPError) as exc:
        print(f"heteroflow agent: {exc}", file=sys.stderr)
        return 2

    async def main(stop: asyncio.Event) -> None:
        from heteroflow.node import serve_agent

        await serve_agent(settings, url, stop)

    unmet = readiness(agent_consumers(settings.node_id))
    _run_until_signal(f"agent-{settings.node_id}", main, (settings.metrics_port, unmet))
    return 0


def _service(args: argparse.Namespace) -> int:
    from heteroflow.platform import Platform, PlatformSettings, service_runner
    from heteroflow.probe import readiness
    from heteroflow.services import by_name
    from libs.store.eventstore import EventStore

    settings = PlatformSettings()
    configure(settings.log_level, settings.log_format)
    collector.tune(settings.gc_threshold)
    if settings.nats_url is None or settings.database_url is None:
        print(
            "heteroflow service: set HETEROFLOW_NATS_URL and HETEROFLOW_DATABASE_URL",
            file=sys.stderr,
        )
        return 2
    spec = by_name(args.name)
    runner = service_runner(spec)

    platform = Platform(settings)
    platform.start_servers()  # resolves the configured URLs; starts nothing embedded

    async def main(stop: asyncio.Event) -> None:
        platform.store = await EventStore.open(platform.database_url)
        try:
            await runner(platform, stop)
        finally:
            await platform.store.close()

    unmet = readiness(spec.consumers(), lambda: platform.store)
    _run_until_signal(args.name, main, (settings.metrics_port, unmet), spec.loop)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = SettingsHelpParser(
        prog="heteroflow", description="Run GPU container work on heterogeneous fleets."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser(
        "up",
        help="start the platform (embedded NATS + PostgreSQL unless URLs are configured)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    up.settings_help = up_settings
    _add_resource_options(up)
    up.add_argument(
        "--processes",
        action="store_true",
        help="run each service and the local agent as its own child process "
        "(also HETEROFLOW_PROCESSES=true)",
    )
    up.set_defaults(func=_up)
    agent = sub.add_parser(
        "agent",
        help="run a node agent (HETEROFLOW_NODE_ID, _NATS_URL, ...)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    agent.settings_help = agent_settings
    _add_resource_options(agent)
    agent.set_defaults(func=_agent)
    service = sub.add_parser(
        "service",
        help="run one control-plane service (/readyz and /metrics on HETEROFLOW_METRICS_PORT)",
    )
    # A metavar: argparse would read the choices to format one, importing every service.
    service.add_argument("name", choices=ServiceNames(), metavar="NAME", help="%(choices)s")
    service.set_defaults(func=_service)
    register_check_commands(sub)
    register_policy_commands(sub)
    register_user_commands(parser, sub)
    register_file_commands(sub)  # apply -f, delete -f, get KIND NAME (workload files)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) >= 2 and argv[0] == "events" and argv[1] in OPS:
        configure("warning", "json")  # logs to stderr; standard output carries the data
        ops_args = build_ops_parser().parse_args(argv[1:])
        return int(ops_args.func(ops_args))
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
