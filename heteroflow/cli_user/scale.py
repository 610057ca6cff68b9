"""`heteroflow groups scale GROUP_ID N`: change a task group's replica count."""

from __future__ import annotations

import argparse
from urllib.parse import quote

from . import output as out
from .client import EXIT_OK, Context

GROUPS = "/task-groups"
ENDED = frozenset({"completed", "failed", "stopped", "cancelled"})


def cmd_groups_scale(ctx: Context, args: argparse.Namespace) -> int:
    path = f"{GROUPS}/{quote(args.group_id, safe='')}/scale"
    data = ctx.client.post(path, {"replicas": args.replicas}).json()
    if ctx.output != "table":
        ctx.print(out.render(data, ctx.output))
        return EXIT_OK
    live = sum(1 for t in data.get("tasks", []) if t.get("status") not in ENDED)
    ctx.print(f"{data['id']}: {data['replicas']} replica(s) wanted, {live} live now")
    return EXIT_OK
