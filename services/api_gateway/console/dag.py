"""A job's DAG as a server-rendered SVG (pure): its tasks in rows by depth, an arrow from
each task to every task that waits on it, each task's status as text and as a symbol.

No script and no style attribute (the page's Content-Security-Policy holds); the page lists
the same tasks with what each waits for as the drawing's text alternative.
"""

from __future__ import annotations

from typing import Any

from markupsafe import Markup, escape

from .charts import dag_levels

BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 190, 58, 28, 56, 12
MARGIN_R = 48  # room on the right for arrows that pass a row by
SYMBOLS = {
    "completed": "✓",
    "failed": "✗",
    "running": "▶",
    "pending": "◷",
    "waiting": "◷",
    "ready": "◷",
    "skipped": "⤼",
    "stopped": "■",
    "cancelled": "■",
}
FILLS = {"completed": "#e3f1e3", "failed": "#f6dede", "running": "#e1ecf7", "skipped": "#eee"}
KEY_CHARS = 22


def symbol(status: str) -> str:
    return SYMBOLS.get(status, "●")


def draw(nodes: list[dict[str, Any]]) -> Markup:
    """The SVG of a job's `tasks` (as `GET /jobs/{id}` answers them)."""
    levels = dag_levels(nodes)
    if not levels:
        return Markup("")
    widest = max(len(level) for level in levels)
    inner = widest * BOX_W + (widest - 1) * GAP_X
    width = PAD * 2 + inner + MARGIN_R
    height = PAD * 2 + len(levels) * BOX_H + (len(levels) - 1) * GAP_Y
    at: dict[str, tuple[float, float]] = {}
    for depth, level in enumerate(levels):
        # Each row centred, so an arrow between rows of different sizes stays short.
        offset = PAD + (inner - (len(level) * BOX_W + (len(level) - 1) * GAP_X)) / 2
        for i, n in enumerate(level):
            at[n["key"]] = (offset + i * (BOX_W + GAP_X), PAD + depth * (BOX_H + GAP_Y))
    gutter = PAD + inner + MARGIN_R
    edges = [
        _edge(n, dep, at, gutter) for level in levels for n in level for dep in n["depends_on"]
    ]
    boxes = [_box(n, *at[n["key"]]) for level in levels for n in level]
    label = f"The job's {len(nodes)} tasks in {len(levels)} rows by depth, arrows to what waits"
    return Markup(
        f'<svg class="dag-svg" role="group" aria-label="{escape(label)}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" height="{height:.0f}" '
        'xmlns="http://www.w3.org/2000/svg">'
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" '
        'markerHeight="8" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#444"/></marker></defs>' + "".join(edges) + "".join(boxes) + "</svg>"
    )


def _edge(
    node: dict[str, Any], dep: dict[str, Any], at: dict[str, tuple[float, float]], gutter: float
) -> str:
    up = str(dep["on"])
    if up not in at:
        return ""
    (x1, y1), (x2, y2) = at[up], at[node["key"]]
    if y2 - y1 > BOX_H + GAP_Y:
        # Over a row: bent out to the right-hand gutter, not through the boxes between.
        x1, y1, x2, y2 = x1 + BOX_W, y1 + BOX_H / 2, x2 + BOX_W, y2 + BOX_H / 2
        d = f"M{x1:.0f},{y1:.0f} C{gutter:.0f},{y1:.0f} {gutter:.0f},{y2:.0f} {x2:.0f},{y2:.0f}"
    else:
        x1, y1, x2, y2 = x1 + BOX_W / 2, y1 + BOX_H, x2 + BOX_W / 2, y2
        mid = (y1 + y2) / 2
        d = f"M{x1:.0f},{y1:.0f} C{x1:.0f},{mid:.0f} {x2:.0f},{mid:.0f} {x2:.0f},{y2:.0f}"
    kind = str(dep.get("kind", "after"))
    dashed = "" if kind == "after" else ' stroke-dasharray="6 4"'
    title = f"{node['key']} waits on {up} ({kind})"
    return (
        f'<path d="{d}" '
        f'fill="none" stroke="#444" stroke-width="1.5" marker-end="url(#arrow)"{dashed}>'
        f"<title>{escape(title)}</title></path>"
    )


def _box(node: dict[str, Any], x: float, y: float) -> str:
    status = str(node["status"])
    key = str(node["key"])
    shown = key if len(key) <= KEY_CHARS else key[: KEY_CHARS - 1] + "…"
    why = f" — {node['why']}" if node.get("why") else ""
    inner = (
        f"<title>{escape(f'{key}: {status}{why}')}</title>"
        f'<rect x="{x:.0f}" y="{y:.0f}" width="{BOX_W}" height="{BOX_H}" rx="6" '
        f'fill="{FILLS.get(status, "#fff")}" stroke="#444"/>'
        f'<text x="{x + 10:.0f}" y="{y + 24:.0f}" font-size="15" font-weight="600" '
        f'fill="#1a1a1a">{escape(shown)}</text>'
        f'<text x="{x + 10:.0f}" y="{y + 46:.0f}" font-size="13" fill="#1a1a1a">'
        f"{escape(symbol(status))} {escape(status)}</text>"
    )
    task = node.get("task")
    if task:
        return f'<a href="/ui/tasks/{escape(task["id"])}">{inner}</a>'
    return f"<g>{inner}</g>"
