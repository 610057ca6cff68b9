"""The user commands of `heteroflow` (run, ps, describe, logs, ...), talking to the HTTP API.

`register_user_commands` adds them to the `heteroflow` parser; each handler gets a `Context`
(client, output format) and returns the exit code documented in docs/cli.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from libs.domain.group.autoscale import Metric

from . import cards, commands, events, jobs, rollout, scale
from .client import Client, CliError, Context, resolve_target
from .output import FORMATS
from .plan import cmd_groups_create

Handler = Callable[[Context, argparse.Namespace], int]
OPS = ("stop", "sleep", "wake", "rm")
OP_HELP = {
    "stop": "stop (pending work is cancelled, placed work stopped)",
    "sleep": "pause a running task, keeping its place",
    "wake": "resume a sleeping task",
    "rm": "delete (stops first when needed)",
}
AS_OF_HELP = "show it as it stood at TIME (RFC 3339, e.g. 2026-12-01T12:00:00Z), from the event log"


class _TrailingCommandParser(argparse.ArgumentParser):
    """`run IMAGE [flags] -- COMMAND...`: argparse alone refuses flags between IMAGE and `--`
    (it settles the positionals at IMAGE), so the words after the first `--` are cut off
    before parsing and become the command."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        words = list(sys.argv[1:] if args is None else args)
        tail: list[str] = []
        if "--" in words:
            cut = words.index("--")
            words, tail = words[:cut], words[cut + 1 :]
        parsed, extra = super().parse_known_args(words, namespace)
        parsed.command = list(getattr(parsed, "command", None) or []) + tail
        return parsed, extra


def _entry(handler: Handler, *, operator: bool = False) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        client: Client | None = None
        try:
            as_operator = bool(getattr(args, "as_operator", False)) or operator
            target = resolve_target(args.server, args.token, operator=as_operator)
            client = Client(target)
            return handler(Context(client, output=args.output or "table"), args)
        except CliError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return exc.exit_code
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:  # `heteroflow ps | head`: the reader had enough
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        finally:
            if client is not None:
                client.close()

    return run


def _connection_options(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument(
        "--server", default=default, help="API URL (env HETEROFLOW_SERVER; else credentials.json)"
    )
    parser.add_argument("--token", default=default, help="bearer credential (env HETEROFLOW_TOKEN)")
    parser.add_argument(
        "--as-operator",
        action="store_true",
        default=default,
        help="use operator_token from credentials.json instead of tenant_api_key",
    )


def _output_option(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("-o", "--output", choices=FORMATS, default=default, help="output format")


def _positive(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _replicas(raw: str) -> int:
    if not raw.isdigit():
        raise argparse.ArgumentTypeError(f"not a replica count: {raw!r}")
    return int(raw)


PLAN_HELP = "show where it would be placed (or why not) and when, creating nothing"


def _add_run(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        parents=parents,
        help="create a task and wait for it (or -d to detach)",
        description="Create a task from IMAGE; COMMAND (after --) runs with sh -c.",
    )
    p.__class__ = _TrailingCommandParser  # see its docstring
    p.add_argument("image")
    p.add_argument("command", nargs="*", help="command words (put them after --)")
    p.add_argument("--name", help="task name (default: the image's base name)")
    p.add_argument("--gpus", type=int, help="whole GPU cards (gpu_required)")
    p.add_argument("--gpu-type", help="vendor or model: nvidia, A100, nvidia/A100")
    p.add_argument("--gpu-memory-mb", type=int, help="a fraction of one card, by VRAM")
    p.add_argument("--gpu-ratio", type=float, help="a fraction of one card, by compute (0-1)")
    p.add_argument("--memory-mb", type=int)
    p.add_argument("--cpu", type=float, help="CPU cores")
    p.add_argument("--priority", type=int, help="0-70 for tenants, up to 99 for operators")
    p.add_argument("--env", action="append", metavar="K=V", help="repeatable")
    p.add_argument("--label", action="append", metavar="K=V", help="repeatable")
    p.add_argument("--volume", action="append", metavar="HOST:CONTAINER[:ro]", help="repeatable")
    p.add_argument("--max-retries", type=int)
    p.add_argument("--retry-delay", type=float, help="seconds before the first retry")
    p.add_argument("--retry-strategy", choices=("retry_new_node", "retry_same_node", "no_retry"))
    p.add_argument("--timeout", type=int, help="seconds, 0 = none")
    p.add_argument("--type", dest="task_type", choices=("training", "inference", "batch"))
    p.add_argument("--node", help="pin to this node (requested_node_id)")
    p.add_argument("--anti-affinity", action="append", metavar="KEY", help="repeatable")
    p.add_argument("--preemptible", action="store_true")
    p.add_argument("--tenant", help="operators: create the task for this tenant")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("-d", "--detach", action="store_true", help="print the id and return")
    mode.add_argument("-f", "--follow", action="store_true", help="stream logs while waiting")
    mode.add_argument("--plan", action="store_true", help=PLAN_HELP)
    p.set_defaults(func=_entry(commands.cmd_run))


def _add_task_commands(
    sub: Any, conn: argparse.ArgumentParser, fmt: argparse.ArgumentParser
) -> None:
    both = [conn, fmt]
    _add_run(sub, both)
    p = sub.add_parser("ps", parents=both, help="list tasks (non-terminal unless -a)")
    p.add_argument("-a", "--all", action="store_true", help="include finished tasks")
    p.add_argument("--status", choices=commands.STATUS_ORDER, help="only this status")
    p.add_argument("--label", action="append", metavar="K=V", help="repeatable; all must match")
    p.set_defaults(func=_entry(commands.cmd_ps))

    p = sub.add_parser("describe", parents=both, help="a task, its attempts and timeline")
    p.add_argument("task_id")
    p.add_argument("--as-of", metavar="TIME", help=AS_OF_HELP)
    p.set_defaults(func=_entry(commands.cmd_describe))

    p = sub.add_parser("logs", parents=[conn], help="a task's output")
    p.add_argument("task_id")
    p.add_argument("-n", "--lines", type=_positive, help="only the last N lines")
    p.add_argument("-f", "--follow", action="store_true", help="stream until the task ends")
    p.set_defaults(func=_entry(commands.cmd_logs))

    for op in OPS:
        p = sub.add_parser(op, parents=both, help=OP_HELP[op])
        p.add_argument("task_ids", nargs="+", metavar="TASK_ID")
        p.set_defaults(func=_entry(commands.cmd_operate), op=op)

    for name, handler, text in (
        ("retries", commands.cmd_retries, "a task's attempts and retry decisions"),
        ("events", events.cmd_events, "a task's fault-tolerance timeline"),
    ):
        p = sub.add_parser(name, parents=both, help=text)
        p.add_argument("task_id")
        p.set_defaults(func=_entry(handler))

    p = sub.add_parser("stats", parents=both, help="task counts by status")
    p.set_defaults(func=_entry(commands.cmd_stats))
    p = sub.add_parser("nodes", parents=both, help="node inventory (operators)")
    p.set_defaults(func=_entry(events.cmd_nodes, operator=True))
    _add_card_commands(p, both)


def _add_card_commands(nodes: argparse.ArgumentParser, both: list[Any]) -> None:
    """`nodes uncordon-card` / `nodes quarantine-card` (bare `nodes` still lists)."""
    nsub = nodes.add_subparsers(dest="nodes_command", metavar="{uncordon-card,quarantine-card}")
    p = nsub.add_parser(
        "uncordon-card", parents=both, help="return a quarantined card to placement now"
    )
    p.add_argument("node_id")
    p.add_argument("gpu_id", metavar="CARD")
    p.set_defaults(func=_entry(cards.cmd_uncordon_card, operator=True))
    p = nsub.add_parser("quarantine-card", parents=both, help="take one card out of placement")
    p.add_argument("node_id")
    p.add_argument("gpu_id", metavar="CARD")
    p.add_argument("--reason", default="", help="shown as the quarantine's evidence")
    p.set_defaults(func=_entry(cards.cmd_quarantine_card, operator=True))


def _add_autoscale(gsub: Any, conn: argparse.ArgumentParser, fmt: argparse.ArgumentParser) -> None:
    p = gsub.add_parser(
        "autoscale",
        parents=[conn, fmt],
        help="set a group's auto_scale (docs/autoscaling.md), or remove it with --off",
    )
    p.add_argument("group_id")
    p.add_argument("--off", action="store_true", help="remove auto_scale")
    p.add_argument(
        "--metric",
        choices=[m.value for m in Metric],
        help="what to scale on (required unless --off)",
    )
    p.add_argument("--target", type=float, help="the per-replica value aimed at (> 0)")
    p.add_argument("--max", type=int, help="max_replicas")
    p.add_argument("--min", type=int, help="min_replicas (default 1)")
    p.add_argument("--cooldown-up", type=float, help="cooldown_up_s (default 60)")
    p.add_argument("--cooldown-down", type=float, help="cooldown_down_s (default 300)")
    p.set_defaults(func=_entry(scale.cmd_groups_autoscale))


def _add_groups(sub: Any, conn: argparse.ArgumentParser, fmt: argparse.ArgumentParser) -> None:
    groups = sub.add_parser(
        "groups",
        help="task groups: ls, describe, events, scale, autoscale, rollout, stop, sleep, wake, rm",
    )
    gsub = groups.add_subparsers(dest="group_command", required=True, metavar="COMMAND")
    p = gsub.add_parser("ls", parents=[conn, fmt], help="list task groups")
    p.add_argument("--status", help="only groups in this status")
    p.set_defaults(func=_entry(events.cmd_groups_ls))
    p = gsub.add_parser("create", parents=[conn, fmt], help="create a group from a JSON file")
    p.add_argument("file", help="the POST /task-groups body (- = stdin)")
    p.add_argument("--tenant", help="operators: create the group for this tenant")
    p.add_argument("--plan", action="store_true", help=PLAN_HELP)
    p.set_defaults(func=_entry(cmd_groups_create))
    p = gsub.add_parser("events", parents=[conn, fmt], help="a group's timeline")
    p.add_argument("group_id")
    p.set_defaults(func=_entry(events.cmd_groups_events))
    p = gsub.add_parser("describe", parents=[conn, fmt], help="a group and its tasks")
    p.add_argument("group_id")
    p.add_argument("--as-of", metavar="TIME", help=AS_OF_HELP)
    p.set_defaults(func=_entry(events.cmd_groups_describe))
    p = gsub.add_parser(
        "scale", parents=[conn, fmt], help="set a group's replica count (not static-world groups)"
    )
    p.add_argument("group_id")
    p.add_argument("replicas", type=_replicas, help="the new replica count (0 allowed)")
    p.set_defaults(func=_entry(scale.cmd_groups_scale))
    _add_autoscale(gsub, conn, fmt)
    rollout.register(gsub, [conn, fmt], _entry)
    for op in OPS:
        p = gsub.add_parser(op, parents=[conn, fmt], help=f"{OP_HELP[op]}, for every member")
        p.add_argument("group_ids", nargs="+", metavar="GROUP_ID")
        p.set_defaults(func=_entry(events.cmd_groups_operate), op=op)


def _add_jobs(sub: Any, conn: argparse.ArgumentParser, fmt: argparse.ArgumentParser) -> None:
    both = [conn, fmt]
    jp = sub.add_parser("jobs", help="jobs (DAGs of tasks): submit, ls, describe, events, stop, rm")
    jsub = jp.add_subparsers(dest="jobs_command", required=True, metavar="COMMAND")
    p = jsub.add_parser("submit", parents=both, help="submit a job from a JSON file (- = stdin)")
    p.add_argument("file")
    p.add_argument("--tenant", help="operators: submit for this tenant")
    p.add_argument("--plan", action="store_true", help=PLAN_HELP)
    p.set_defaults(func=_entry(jobs.cmd_jobs_submit))
    p = jsub.add_parser("ls", parents=both, help="list jobs")
    p.add_argument("--status", help="only jobs in this status")
    p.set_defaults(func=_entry(jobs.cmd_jobs_ls))
    commands_by_name: tuple[tuple[str, Handler, str], ...] = (
        ("describe", jobs.cmd_jobs_describe, "a job's DAG: each task's status and why it waits"),
        ("events", jobs.cmd_jobs_events, "a job's events"),
        ("stop", jobs.cmd_jobs_stop, "stop a job (waiting tasks are skipped)"),
        ("rm", jobs.cmd_jobs_rm, "delete a job (stops it first)"),
    )
    for name, handler, text in commands_by_name:
        p = jsub.add_parser(name, parents=both, help=text)
        p.add_argument("job_id")
        if name == "describe":
            p.add_argument("--as-of", metavar="TIME", help=AS_OF_HELP)
        p.set_defaults(func=_entry(handler))
    for noun, table, what in (
        ("queues", jobs.QUEUE_COMMANDS, "queues with quota and policy"),
        ("pools", jobs.POOL_COMMANDS, "resource pools"),
    ):
        np = sub.add_parser(noun, help=f"{what}: ls, describe, create, update, rm")
        nsub = np.add_subparsers(dest=f"{noun}_command", required=True, metavar="COMMAND")
        operator = noun == "pools"
        for verb, action in table.items():
            p = nsub.add_parser(verb, parents=both, help=f"{verb} {noun}")
            if verb in ("describe", "update", "rm"):
                p.add_argument("name")
            if verb in ("create", "update"):
                p.add_argument("file", help="JSON document (- = stdin)")
            writes = verb in ("create", "update", "rm")
            p.set_defaults(func=_entry(action, operator=operator or writes))


def register_user_commands(parser: argparse.ArgumentParser, sub: Any) -> None:
    """Add the user commands to `sub`, and the connection/output options to `parser`.

    The options work before the command (`heteroflow -o json ps`) and after it; the
    subcommands' copies default to SUPPRESS so they never overwrite a value given before.
    """
    _connection_options(parser, None)
    _output_option(parser, None)
    conn = argparse.ArgumentParser(add_help=False)
    _connection_options(conn, argparse.SUPPRESS)
    fmt = argparse.ArgumentParser(add_help=False)
    _output_option(fmt, argparse.SUPPRESS)
    _add_task_commands(sub, conn, fmt)
    _add_groups(sub, conn, fmt)
    _add_jobs(sub, conn, fmt)


__all__ = ["register_user_commands"]
