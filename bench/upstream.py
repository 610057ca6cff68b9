"""A stand-in inference replica for the serving suite: `python -m bench.upstream PORT`.

Answers every path with a small fixed body at once (uvicorn, httptools, uvloop), so the
serving suite measures the router, not the replica.
"""

from __future__ import annotations

import sys
from typing import Any

import uvicorn

BODY = b'{"text": "ok"}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})


if __name__ == "__main__":
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=int(sys.argv[1]),
        loop="uvloop",
        http="httptools",
        lifespan="off",
        log_level="critical",
        access_log=False,
    )
