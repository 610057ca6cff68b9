"""What the console's pages draw (pure): small inline SVG charts (no script, no style
attribute, so the page's Content-Security-Policy holds) and a job's tasks laid out by depth."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from markupsafe import Markup

WIDTH, HEIGHT = 320, 60


def sparkline(values: Sequence[float], top: float, label: str) -> str:
    """An SVG polyline of `values` scaled to 0..`top`, with a text alternative that states
    the last and highest value (readable without the drawing)."""
    if not values:
        return ""
    top = max(top, max(values), 1e-9)
    step = WIDTH / max(1, len(values) - 1)
    points = " ".join(
        f"{i * step:.1f},{HEIGHT - (v / top) * HEIGHT:.1f}" for i, v in enumerate(values)
    )
    alt = f"{label}: last {values[-1]:.1f}, highest {max(values):.1f} of {top:.0f}"
    return (
        f'<svg class="spark" role="img" aria-label="{_escape(alt)}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{_escape(alt)}</title>"
        f'<polyline fill="none" stroke="#0b4f8a" stroke-width="2" points="{points}"/></svg>'
    )


def bar(value: float, top: float, label: str, unit: str = "") -> str:
    """A horizontal bar of `value` out of `top`, with the figures as its text alternative."""
    alt = f"{label}: {value:g}{unit} of {max(top, value):g}{unit}"
    top = max(top, value, 1e-9)
    filled = WIDTH * value / top
    return (
        f'<svg class="bar" role="img" aria-label="{_escape(alt)}" viewBox="0 0 {WIDTH} 16" '
        f'width="{WIDTH}" height="16" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{_escape(alt)}</title>"
        f'<rect x="0" y="0" width="{WIDTH}" height="16" fill="#e6e6e6" stroke="#999"/>'
        f'<rect x="0" y="0" width="{filled:.1f}" height="16" fill="#0b4f8a"/></svg>'
    )


def serving_charts(samples: list[dict[str, float]]) -> dict[str, Markup]:
    """Requests/s and latency p95 over the samples seen, replicas ready of total now."""
    if not samples:
        return {}
    last = samples[-1]
    rps = [s["rps"] for s in samples]
    p95 = [s["p95"] for s in samples]
    # One sample draws as a flat line: a polyline needs two points.
    rps, p95 = (rps * 2, p95 * 2) if len(samples) == 1 else (rps, p95)
    return {
        "rps": Markup(sparkline(rps, 1, "requests per second")),
        "p95": Markup(sparkline(p95, 1, "latency p95 ms")),
        "ready": Markup(bar(last["ready"], last["total"], "replicas ready")),
    }


def _escape(text: str) -> str:
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )


def gpu_charts(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Per card of a `GET /tasks/{id}/gpu-metrics` answer: utilisation and memory."""
    out = []
    for s in body.get("series", []):
        pts = s["points"]
        total = max((p["memory_total_mb"] for p in pts), default=0.0)
        util = sparkline([p["utilization_pct"] for p in pts], 100, "utilisation %")
        memory = sparkline([p["memory_used_mb"] for p in pts], total, "memory MB")
        out.append({"gpu_id": s["gpu_id"], "utilization": Markup(util), "memory": Markup(memory)})
    return out


def dag_levels(nodes: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """A job's tasks by depth: a task sits one level below its deepest upstream."""
    upstream = {n["key"]: [str(d["on"]) for d in n["depends_on"]] for n in nodes}
    depth: dict[str, int] = {}

    def level(key: str, seen: frozenset[str] = frozenset()) -> int:
        if key not in depth:
            ups = [u for u in upstream.get(key, []) if u in upstream and u not in seen]
            depth[key] = 1 + max((level(u, seen | {key}) for u in ups), default=-1)
        return depth[key]

    levels: list[list[dict[str, Any]]] = []
    for n in nodes:
        d = level(n["key"])
        while len(levels) <= d:
            levels.append([])
        levels[d].append(n | {"after": upstream[n["key"]]})
    return levels
