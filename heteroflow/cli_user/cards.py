"""`heteroflow nodes uncordon-card NODE CARD` and `nodes quarantine-card NODE CARD`:
an operator's hand on card quarantine (docs/operations.md, device faults)."""

from __future__ import annotations

import argparse
from urllib.parse import quote

from . import output as out
from .client import EXIT_OK, Context


def _path(args: argparse.Namespace, action: str) -> str:
    return f"/nodes/{quote(args.node_id, safe='')}/gpus/{quote(args.gpu_id, safe='')}/{action}"


def _show(ctx: Context, node: dict[str, object], said: str) -> int:
    if ctx.output != "table":
        ctx.print(out.render(node, ctx.output))
    else:
        ctx.note(said)
    return EXIT_OK


def cmd_uncordon_card(ctx: Context, args: argparse.Namespace) -> int:
    node = ctx.client.post(_path(args, "uncordon")).json()
    return _show(ctx, node, f"Card {args.gpu_id} of node {args.node_id} is placeable again.")


def cmd_quarantine_card(ctx: Context, args: argparse.Namespace) -> int:
    node = ctx.client.post(_path(args, "quarantine"), {"reason": args.reason}).json()
    return _show(
        ctx,
        node,
        f"Card {args.gpu_id} of node {args.node_id} is quarantined: no new placement on it "
        "until its health probes pass or `heteroflow nodes uncordon-card`.",
    )
