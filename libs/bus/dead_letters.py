"""The messages consumers gave up on, as an operator reads them from HF_DLQ.

`forward_dead_letters` (libs/bus/nats.py) copies a message that failed `max_deliver` times to
``hf.dlq.<subject>`` with headers naming the stream, consumer, sequence and deliveries;
`heteroflow events dead-letters --consumers` prints them with `read_dead_letters`.
"""

from __future__ import annotations

import base64
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from . import subjects as s
from .nats import (
    HDR_DLQ_CONSUMER,
    HDR_DLQ_DELIVERIES,
    HDR_DLQ_STREAM,
    HDR_DLQ_STREAM_SEQ,
    HDR_DLQ_SUBJECT,
)


def _body(data: bytes) -> dict[str, str]:
    try:
        return {"data": data.decode()}
    except UnicodeDecodeError:
        return {"data_base64": base64.b64encode(data).decode()}


async def read_dead_letters(js: JetStreamContext, limit: int = 100) -> list[dict[str, Any]]:
    """Up to `limit` messages of HF_DLQ, newest first, each as a JSON-ready dict."""
    try:
        info = await js.stream_info(s.DLQ_STREAM)
    except NotFoundError:
        return []
    first, seq = info.state.first_seq, info.state.last_seq
    out: list[dict[str, Any]] = []
    while seq >= max(first, 1) and len(out) < limit:
        try:
            msg = await js.get_msg(s.DLQ_STREAM, seq)
        except NotFoundError:  # deleted, or aged out meanwhile
            seq -= 1
            continue
        headers = msg.headers or {}
        deliveries = headers.get(HDR_DLQ_DELIVERIES, "")
        stream_seq = headers.get(HDR_DLQ_STREAM_SEQ, "")
        out.append(
            {
                "dlq_seq": msg.seq,
                "dlq_subject": msg.subject,
                "stream": headers.get(HDR_DLQ_STREAM),
                "consumer": headers.get(HDR_DLQ_CONSUMER),
                "stream_seq": int(stream_seq) if stream_seq.isdigit() else None,
                "subject": headers.get(HDR_DLQ_SUBJECT),
                "deliveries": int(deliveries) if deliveries.isdigit() else None,
                "dead_at": msg.time.isoformat() if msg.time else None,
                **_body(msg.data or b""),
            }
        )
        seq -= 1
    return out


__all__ = ["read_dead_letters"]
