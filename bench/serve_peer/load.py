"""Load for `python -m bench serve-peer`: JSON requests with wrk when it is installed (else
the project's closed-loop client, bench/serving.py), SSE streams with an asyncio client."""

from __future__ import annotations

import asyncio
import re
import shutil
import time

from ..serving import closed_loop

WRK = shutil.which("wrk")
_UNIT = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


def parse_wrk(text: str) -> tuple[float, float, float]:
    """(req/s, p50 ms, p99 ms) from `wrk --latency` output; the rate counts 2xx answers only
    (wrk counts every answer: a system failing fast would look fast)."""
    m = re.search(r"Requests/sec:\s*([\d.]+)", text)
    if m is None:
        raise RuntimeError(f"wrk gave no rate: {text.strip()[-200:]!r}")
    rate = float(m.group(1))
    total = re.search(r"^\s*(\d+) requests in", text, re.M)
    bad = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", text)
    if total and bad and int(total.group(1)):
        rate *= 1 - int(bad.group(1)) / int(total.group(1))

    def pct(q: str) -> float:
        m = re.search(rf"^\s*{q}%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
        return float(m.group(1)) * _UNIT[m.group(2)] if m else float("nan")

    return rate, pct("50"), pct("99")


async def json_load(
    port: int, path: str, key: str, conns: int, seconds: float
) -> tuple[float, float, float]:
    if WRK:
        cmd = [WRK, "-t1", f"-c{conns}", f"-d{max(1, round(seconds))}s", "--latency"]
        if key:
            cmd += ["-H", f"Authorization: Bearer {key}"]
        proc = await asyncio.create_subprocess_exec(
            *cmd, f"http://127.0.0.1:{port}{path}", stdout=asyncio.subprocess.PIPE
        )
        out, _ = await proc.communicate()
        return parse_wrk(out.decode())
    n = max(200, int(seconds * 500))
    side = await closed_loop("load", port, path, key, n, conns)
    return side.rate(), side.pct(50), side.pct(99)


async def one_stream(port: int, path: str, key: str) -> int:
    """Chunks (`data:` events) of one SSE answer read to its end; -1 when it failed."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    except OSError:
        return -1
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Connection: close\r\n\r\n".encode()
    )
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        if not head.startswith(b"HTTP/1.1 200"):
            return -1
        body = await asyncio.wait_for(reader.read(), 60)
        return body.count(b"data:")
    except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return -1
    finally:
        writer.close()


async def sse_load(port: int, path: str, key: str, streams: int, chunks: int) -> tuple[float, int]:
    """(chunks/s over all streams, streams that failed or came back short)."""
    t0 = time.perf_counter()
    got = await asyncio.gather(*(one_stream(port, path, key) for _ in range(streams)))
    seconds = time.perf_counter() - t0
    failed = sum(1 for g in got if g != chunks)
    return sum(g for g in got if g > 0) / seconds, failed
