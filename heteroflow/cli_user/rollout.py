"""`heteroflow groups rollout start|status|pause|resume|rollback|partition GROUP_ID`: rolling
updates of a task group (docs/rollout.md)."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

from . import output as out
from .client import EXIT_OK, Context

GROUPS = "/task-groups"


def _path(group_id: str, action: str = "") -> str:
    tail = f"/{action}" if action else ""
    return f"{GROUPS}/{quote(group_id, safe='')}/rollout{tail}"


def start_body(args: argparse.Namespace) -> dict[str, Any]:
    """The request body from the flags: only what was given (the API fills the defaults)."""
    body: dict[str, Any] = {}
    if args.image:
        body["image"] = args.image
    if args.env is not None:
        body["env"] = list(args.env)
    for flag, key in (
        ("max_surge", "max_surge"),
        ("max_unavailable", "max_unavailable"),
        ("partition", "partition"),
        ("health_timeout", "health_timeout_s"),
        ("strategy", "strategy"),
    ):
        value = getattr(args, flag)
        if value is not None:
            body[key] = value
    return body


def show(ctx: Context, data: dict[str, Any]) -> int:
    if ctx.output != "table":
        ctx.print(out.render(data, ctx.output))
        return EXIT_OK
    ctx.print(
        f"{data['group_id']}: generation {data['generation']}, rollout {data['rollout_id']} "
        f"{data['phase']}" + (f" ({data['reason']})" if data.get("reason") else "")
    )
    for r in data.get("replicas", []):
        ctx.print(f"  generation {r['generation']}: {r['live']} live, {r['draining']} draining")
    for b in data.get("batches", []):
        why = f": {b['reason']}" if b.get("reason") else ""
        ctx.print(
            f"  batch {b['number']} attempt {b['attempt']} {b['step']} ranks {b['ranks']}{why}"
        )
    return EXIT_OK


def cmd_rollout_start(ctx: Context, args: argparse.Namespace) -> int:
    data = ctx.client.post(_path(args.group_id), start_body(args)).json()
    return show(ctx, data)


def cmd_rollout_partition(ctx: Context, args: argparse.Namespace) -> int:
    data = ctx.client.post(_path(args.group_id), {"partition": args.partition}).json()
    return show(ctx, data)


def cmd_rollout_status(ctx: Context, args: argparse.Namespace) -> int:
    return show(ctx, ctx.client.get(_path(args.group_id)))


def cmd_rollout_action(ctx: Context, args: argparse.Namespace) -> int:
    return show(ctx, ctx.client.post(_path(args.group_id, args.action)).json())


def register(gsub: Any, both: list[argparse.ArgumentParser], entry: Any) -> None:
    """`groups rollout ...` under the `groups` command."""
    rp = gsub.add_parser("rollout", help="rolling update: start, status, pause, resume, rollback")
    rsub = rp.add_subparsers(dest="rollout_command", required=True, metavar="COMMAND")
    p = rsub.add_parser("start", parents=both, help="start a rolling update of a group")
    p.add_argument("group_id")
    p.add_argument("--image", help="the new image")
    p.add_argument("--env", action="append", metavar="K=V", help="new environment (repeat)")
    p.add_argument("--max-surge", type=int, help="new replicas beyond the size at a time")
    p.add_argument(
        "--max-unavailable", type=int, help="old replicas out of service before their replacement"
    )
    p.add_argument("--partition", type=int, help="canary: update only ranks below N")
    p.add_argument("--health-timeout", type=int, help="seconds a new replica has to be healthy")
    p.add_argument("--strategy", choices=("rolling", "recreate"))
    p.set_defaults(func=entry(cmd_rollout_start))
    p = rsub.add_parser("status", parents=both, help="generation, phase, replicas, batches")
    p.add_argument("group_id")
    p.set_defaults(func=entry(cmd_rollout_status))
    p = rsub.add_parser("partition", parents=both, help="move the canary partition")
    p.add_argument("group_id")
    p.add_argument("partition", type=int)
    p.set_defaults(func=entry(cmd_rollout_partition))
    for action in ("pause", "resume", "rollback"):
        p = rsub.add_parser(action, parents=both, help=f"{action} the group's rollout")
        p.add_argument("group_id")
        p.set_defaults(func=entry(cmd_rollout_action), action=action)
