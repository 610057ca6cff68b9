"""The table of `python -m bench serve-peer` and the issue's targets, from the rounds' figures.

`Figures` of one system in one round are a flat dict: c1_rate, c1_p50, c1_p99, c16_rate,
c16_p99, c64_rate, c64_p99 (req/s, ms), sse_rate (chunks/s), s256_failed, rss_before,
rss_after (MiB, the gateway only), cpu_req_ms, cpu_chunk_us (the gateway only). A figure
missing or NaN is shown as "–"; a target that cannot be judged is "n/a".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Figures = dict[str, float]
CHUNKS = 100  # events per SSE answer of the app

DIRECT, HETEROFLOW, RAY = "replica directly (uvicorn)", "HeteroFlow /serve/{id}/...", "Ray Serve"
# A floor, not a peer: a proven C proxy (one thread, like the one gateway worker) in front of
# the same replica, on the same cores: what any proxy in between costs on this machine.
HAPROXY = "HAProxy (1 thread) in front"
COLUMNS: list[tuple[str, str, str]] = [  # key, header, format
    ("c1_rate", "c=1 req/s", ",.0f"),
    ("c1_p50", "c=1 p50 ms", ".2f"),
    ("c1_p99", "c=1 p99 ms", ".2f"),
    ("c16_rate", "c=16 req/s", ",.0f"),
    ("c16_p99", "c=16 p99 ms", ".1f"),
    ("c64_rate", "c=64 req/s", ",.0f"),
    ("c64_p99", "c=64 p99 ms", ".1f"),
    ("sse_rate", "SSE chunks/s (32×100)", ",.0f"),
    ("s256_failed", "256 streams failed", ".0f"),
    ("rss_before", "gw RSS before MiB", ".0f"),
    ("rss_after", "gw RSS after MiB", ".0f"),
    ("cpu_req_ms", "gw CPU/req ms", ".3f"),
    ("cpu_chunk_us", "gw CPU/chunk µs", ".1f"),
]


def values(rounds: Sequence[Figures], key: str) -> list[float]:
    return [r[key] for r in rounds if key in r and not math.isnan(r[key])]


def span(rounds: Sequence[Figures], key: str, fmt: str) -> str:
    """min–max over the rounds (one value when they agree or there is one round)."""
    v = values(rounds, key)
    if not v:
        return "–"
    lo, hi = format(min(v), fmt), format(max(v), fmt)
    return lo if lo == hi else f"{lo}–{hi}"


def render(results: dict[str, list[Figures]], notes: dict[str, str]) -> str:
    head = "| | " + " | ".join(h for _, h, _ in COLUMNS) + " |"
    lines = [head, "|---" * (len(COLUMNS) + 1) + "|"]
    for name, rounds in results.items():
        if name in notes:
            cells = [notes[name]] + [""] * (len(COLUMNS) - 1)
        else:
            cells = [span(rounds, k, f) for k, _, f in COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _worst(rounds: Sequence[Figures], key: str, high_is_good: bool) -> float:
    v = values(rounds, key)
    if not v:
        return math.nan
    return min(v) if high_is_good else max(v)


def _best(rounds: Sequence[Figures], key: str, high_is_good: bool) -> float:
    v = values(rounds, key)
    if not v:
        return math.nan
    return max(v) if high_is_good else min(v)


def targets(results: dict[str, list[Figures]]) -> list[tuple[str, str, str]]:
    """(target, PASS/FAIL/n/a, the figures): HeteroFlow's worst round against the peers'
    best round, so a PASS holds over every round."""
    hf, d, ray = (results.get(n, []) for n in (HETEROFLOW, DIRECT, RAY))
    out: list[tuple[str, str, str]] = []

    def check(name: str, ok: bool | None, why: str) -> None:
        out.append((name, "n/a" if ok is None else ("PASS" if ok else "FAIL"), why))

    def judged(*xs: float) -> bool:
        return not any(math.isnan(x) for x in xs)

    h16, r16, d16 = (
        _worst(hf, "c16_rate", True),
        _best(ray, "c16_rate", True),
        _best(d, "c16_rate", True),
    )
    check(
        "c=16 ≥ 3× Ray", h16 >= 3 * r16 if judged(h16, r16) else None, f"{h16:,.0f} vs {r16:,.0f}"
    )
    check(
        "c=16 ≥ 25 % of direct",
        h16 >= 0.25 * d16 if judged(h16, d16) else None,
        f"{h16:,.0f} vs {d16:,.0f}",
    )
    hp, rp = _worst(hf, "c16_p99", False), _best(ray, "c16_p99", False)
    check(
        "c=16 p99 ≤ ½ Ray's", hp <= rp / 2 if judged(hp, rp) else None, f"{hp:.1f} vs {rp:.1f} ms"
    )
    added = _worst(hf, "c1_p50", False) - _best(d, "c1_p50", False)
    check("c=1 added p50 ≤ 0.3 ms", added <= 0.3 if judged(added) else None, f"{added:.2f} ms")
    falls = _no_fall(hf)
    check("no fall c=1→16→64", all(falls) if falls else None, f"{sum(falls)}/{len(falls)} rounds")
    hs, ds = _worst(hf, "sse_rate", True), _best(d, "sse_rate", True)
    check(
        "SSE ≥ 80 % of direct",
        hs >= 0.8 * ds if judged(hs, ds) else None,
        f"{hs:,.0f} vs {ds:,.0f}",
    )
    failed = _worst(hf, "s256_failed", False)
    check(
        "256 streams: none fails", failed == 0 if judged(failed) else None, f"{failed:.0f} failed"
    )
    return out


def _no_fall(rounds: Sequence[Figures]) -> list[bool]:
    """Per round: the rate does not fall from c=1 to c=16 to c=64."""
    keys = ("c1_rate", "c16_rate", "c64_rate")
    return [
        r["c1_rate"] <= r["c16_rate"] <= r["c64_rate"]
        for r in rounds
        if all(k in r and not math.isnan(r[k]) for k in keys)
    ]


def floors(results: dict[str, list[Figures]]) -> list[str]:
    """What the machine allows any proxy, from the HAProxy row (not targets, context)."""
    ha = results.get(HAPROXY, [])
    out: list[str] = []
    falls = _no_fall(ha)
    if falls:
        out.append(f"floor  HAProxy no fall c=1→16→64: {sum(falls)}/{len(falls)} rounds")
    for c in (16, 64):
        h, a = (
            _worst(results.get(HETEROFLOW, []), f"c{c}_rate", True),
            _best(ha, f"c{c}_rate", True),
        )
        if not math.isnan(h) and not math.isnan(a) and a:
            out.append(
                f"floor  HeteroFlow c={c} rate / HAProxy's: {h:,.0f} / {a:,.0f} = {h / a:.0%}"
            )
    return out


def render_targets(rows: list[tuple[str, str, str]]) -> str:
    return "\n".join(f"{verdict:4}  {name}: {why}" for name, verdict, why in rows)
