"""Small inline SVG charts for the console's pages (pure; no script, no style attribute, so
the page's Content-Security-Policy holds)."""

from __future__ import annotations

from collections.abc import Sequence

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


def _escape(text: str) -> str:
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )
