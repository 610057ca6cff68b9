"""`heteroflow groups scale GROUP_ID N`: change a task group's replica count;
`heteroflow groups autoscale GROUP_ID ...`: set (or `--off` remove) its `auto_scale`."""

from __future__ import annotations

import argparse
from urllib.parse import quote

from . import output as out
from .client import EXIT_OK, Context, UsageError

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


def autoscale_body(args: argparse.Namespace) -> dict[str, object]:
    if args.off:
        return {"auto_scale": None}
    missing = [f"--{n}" for n in ("metric", "target", "max") if getattr(args, n) is None]
    if missing:
        raise UsageError(f"groups autoscale needs {', '.join(missing)} (or --off)")
    cfg: dict[str, object] = {
        "metric": args.metric,
        "target": args.target,
        "max_replicas": args.max,
    }
    optional = {
        "min_replicas": args.min,
        "cooldown_up_s": args.cooldown_up,
        "cooldown_down_s": args.cooldown_down,
    }
    cfg |= {k: v for k, v in optional.items() if v is not None}
    return {"auto_scale": cfg}


def cmd_groups_autoscale(ctx: Context, args: argparse.Namespace) -> int:
    path = f"{GROUPS}/{quote(args.group_id, safe='')}"
    data = ctx.client.request("PUT", path, body=autoscale_body(args)).json()
    if ctx.output != "table":
        ctx.print(out.render(data, ctx.output))
        return EXIT_OK
    cfg = data.get("auto_scale")
    if cfg is None:
        ctx.print(f"{data['id']}: autoscaling off ({data['replicas']} replica(s))")
        return EXIT_OK
    ctx.print(
        f"{data['id']}: autoscaling on {cfg['metric']} target {cfg['target']:g} per replica, "
        f"{cfg['min_replicas']}..{cfg['max_replicas']} replicas "
        f"(cooldowns up {cfg['cooldown_up_s']:g} s, down {cfg['cooldown_down_s']:g} s)"
    )
    return EXIT_OK
