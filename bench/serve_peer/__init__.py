"""`python -m bench serve-peer`: the replica directly, HeteroFlow's `/serve/{id}/…` and Ray
Serve's HTTP proxy, the same FastAPI app (app.py) behind each, one after the other, rounds
alternating (docs/benchmarks.md "Serving beside Ray Serve").

HeteroFlow is the gateway as `heteroflow service api-gateway` runs it (bench/gateway_load.py)
over embedded servers, routing to a running inference task whose replica is the app (as the
serving suite sets it up), with a tenant key. The gateway's CPU (its processes' user+system
time) and RSS are read before and after each step. Ray runs in this process when `ray[serve]`
is importable and is shut down after each round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from libs.logging import configure

from .. import fresh_database, servers
from ..gateway_load import GatewayLoad, _free_port, _start, _stop, _wait_ready
from ..report import environment
from ..serving import seed_replica
from .load import WRK, json_load, sse_load
from .table import (
    CHUNKS,
    DIRECT,
    HAPROXY,
    HETEROFLOW,
    RAY,
    Figures,
    floors,
    render,
    render_targets,
    targets,
)

DESCRIPTION = "the replica, HeteroFlow /serve/ and Ray Serve: req/s, p99, SSE, gateway CPU"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench serve-peer", description=DESCRIPTION)
    p.add_argument("--rounds", type=int, default=2, help="rounds alternating the systems (2)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per JSON load step (5)")
    p.add_argument("--quick", action="store_true", help="1 s steps, few streams (for tests)")
    p.add_argument("--no-ray", action="store_true", help="leave Ray Serve out")
    p.add_argument("--no-haproxy", action="store_true", help="leave the HAProxy floor out")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write every figure as JSON")
    return p


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def ray_missing() -> str:
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means no Ray row
        return f"ray[serve] not importable ({type(e).__name__}): pip install 'ray[serve]'"
    return ""


class Gateway:
    """The gateway's processes: CPU seconds and RSS (MiB) summed over the parent and workers."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)

    def _procs(self) -> list[psutil.Process]:
        return [self.root, *self.root.children(recursive=True)]

    def cpu(self) -> float:
        total = 0.0
        for p in self._procs():
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    def rss(self) -> float:
        total = 0
        for p in self._procs():
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return total / 2**20


async def measure(
    port: int, prefix: str, key: str, quick: bool, duration: float, gw: Gateway | None
) -> Figures:
    seconds = 1.0 if quick else duration
    f: Figures = {}
    # Warm-up: connections, the app's first requests.
    await json_load(port, prefix + "/v1/answer", key, 4, 1.0)
    for c in (1, 16, 64):
        c0 = gw.cpu() if gw else 0.0
        rate, p50, p99 = await json_load(port, prefix + "/v1/answer", key, c, seconds)
        f[f"c{c}_rate"], f[f"c{c}_p99"] = rate, p99
        if c == 1:
            f["c1_p50"] = p50
        if gw and c == 16 and rate:
            f["cpu_req_ms"] = (gw.cpu() - c0) / (rate * seconds) * 1000
    streams = 8 if quick else 32
    c0 = gw.cpu() if gw else 0.0
    t0 = time.perf_counter()
    f["sse_rate"], _ = await sse_load(port, prefix + "/v1/stream", key, streams, CHUNKS)
    if gw and f["sse_rate"]:
        chunks = f["sse_rate"] * (time.perf_counter() - t0)
        f["cpu_chunk_us"] = (gw.cpu() - c0) / chunks * 1e6
    if gw:
        f["rss_before"] = gw.rss()
    _, failed = await sse_load(port, prefix + "/v1/stream", key, 32 if quick else 256, CHUNKS)
    f["s256_failed"] = float(failed)
    if gw:
        f["rss_after"] = gw.rss()
    return f


async def run_direct(args: argparse.Namespace) -> Figures:
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.serve_peer.app", str(port)
    )
    try:
        await _wait_port(port)
        return await measure(port, "", "", args.quick, args.duration, None)
    finally:
        await _stop(proc)


HAPROXY_CONFIG = """\
global
    nbthread 1
    maxconn 8192
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    option http-keep-alive
    http-reuse always
frontend in
    bind 127.0.0.1:{port}
    default_backend replica
backend replica
    server r1 127.0.0.1:{upstream} maxconn 1024
"""


async def run_haproxy(args: argparse.Namespace) -> Figures:
    """HAProxy with one thread (as the gateway has one worker) before the same replica."""
    port, up_port = _free_port(), _free_port()
    replica = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.serve_peer.app", str(up_port)
    )
    try:
        with tempfile.TemporaryDirectory(prefix="hf-bench-haproxy-") as home:
            cfg = Path(home) / "haproxy.cfg"
            cfg.write_text(HAPROXY_CONFIG.format(port=port, upstream=up_port))
            proxy = await asyncio.create_subprocess_exec(
                "haproxy", "-db", "-f", str(cfg), stdout=asyncio.subprocess.DEVNULL
            )
            try:
                await _wait_port(up_port)
                await _wait_port(port)
                return await measure(port, "", "", args.quick, args.duration, Gateway(proxy.pid))
            finally:
                await _stop(proxy)
    finally:
        await _stop(replica)


async def _wait_port(port: int, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while True:
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def run_heteroflow(args: argparse.Namespace, db: str, nats: str) -> Figures:
    up_port, gw_port, probe = _free_port(), _free_port(), _free_port()
    replica = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.serve_peer.app", str(up_port)
    )
    try:
        with fresh_database(db) as url, tempfile.TemporaryDirectory(prefix="hf-bench-sp-") as home:
            key, task_id = await seed_replica(url, up_port)
            load = GatewayLoad(url, nats, key, 0.0, 0.0, 64, 1)
            gateway = await _start(load, gw_port, probe, home)
            try:
                await _wait_ready(probe, gateway)
                await _wait_port(up_port)
                await _wait_port(gw_port)
                gw = Gateway(gateway.pid)
                return await measure(
                    gw_port, f"/serve/{task_id}", key, args.quick, args.duration, gw
                )
            finally:
                await _stop(gateway)
    finally:
        await _stop(replica)


async def run_ray(args: argparse.Namespace) -> Figures:
    # Typed as Any: ray's annotations differ between installs with and without it.
    ray: Any = importlib.import_module("ray")
    serve: Any = importlib.import_module("ray.serve")

    from .app import app

    class Ingress:
        pass

    replica: Any = serve.deployment(serve.ingress(app)(Ingress))

    port = _free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(replica.bind(), route_prefix="/")
        return await measure(port, "", "", args.quick, args.duration, None)
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


async def run_all(
    args: argparse.Namespace, names: Sequence[str], db: str, nats: str
) -> tuple[dict[str, list[Figures]], list[str]]:
    results: dict[str, list[Figures]] = {n: [] for n in names}
    notes: list[str] = []
    for i in range(args.rounds):
        for name in names:
            _say(f"round {i + 1}/{args.rounds}: {name} …")
            try:
                if name == DIRECT:
                    f = await run_direct(args)
                elif name == HETEROFLOW:
                    f = await run_heteroflow(args, db, nats)
                elif name == HAPROXY:
                    f = await run_haproxy(args)
                else:
                    f = await run_ray(args)
            except Exception as e:  # noqa: BLE001 - reported, the other systems go on
                notes.append(f"round {i + 1} {name}: failed: {type(e).__name__}: {e}")
                continue
            results[name].append(f)
            _say(f"round {i + 1}/{args.rounds}: {name}: {f}")
    return results, notes


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure("warning", "json")
    why = "left out (--no-ray)" if args.no_ray else ray_missing()
    ha_why = (
        "left out (--no-haproxy)"
        if args.no_haproxy
        else ("" if shutil.which("haproxy") else "not installed (apt install haproxy)")
    )
    names = [DIRECT, HETEROFLOW] + ([] if why else [RAY]) + ([] if ha_why else [HAPROXY])
    env = environment()
    busy = psutil.cpu_percent(interval=0.5)
    with servers() as srv:
        results, notes = asyncio.run(run_all(args, names, srv.database_url, srv.nats_url))
    missing = {n: w for n, w in ((RAY, why), (HAPROXY, ha_why)) if w}
    for name in missing:
        results[name] = []
    client = "wrk" if WRK else "bench/httpload.py"
    print(f"{env['date']}, {env['cpus']} CPUs, {busy:.0f}% busy before the run, {env['command']}")
    print(f"JSON load: {client}; SSE: asyncio client; {args.rounds} round(s), min–max")
    print()
    print(render(results, missing))
    print()
    print(render_targets(targets(results)))
    if floor := floors(results):
        print("\n".join(floor))
    if notes:
        print()
        print("\n".join(f"* {n}" for n in notes))
    if args.json:
        doc = {**env, "cpu_busy_percent_before": busy, "options": vars(args), "results": results}
        args.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return 0
