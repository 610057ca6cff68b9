"""The replica of `python -m bench serve-peer`: one FastAPI app, served as is by uvicorn
(`python -m bench.serve_peer.app PORT`), behind HeteroFlow's `/serve/{task}/…` and inside a
Ray Serve deployment. A tiny JSON answer, and an SSE stream of `CHUNKS` events."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator

import uvicorn
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from bench.serve_peer.table import CHUNKS

app = FastAPI()


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@app.get("/v1/answer")
async def answer() -> dict[str, str]:
    return {"text": "ok"}


@app.get("/v1/stream")
async def stream() -> StreamingResponse:
    async def events() -> AsyncIterator[bytes]:
        for i in range(CHUNKS):
            yield b"data: " + str(i).encode() + b"\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


if __name__ == "__main__":
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=int(sys.argv[1]),
        loop="uvloop",
        http="httptools",
        log_level="critical",
        access_log=False,
        backlog=1024,
    )
