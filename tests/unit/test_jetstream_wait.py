"""`when_jetstream_answers`: a call met by a cluster without a meta leader is tried again; a
refusal, or the not-ready error past the wait, is raised."""

from __future__ import annotations

import nats.errors
import pytest
from nats.js.errors import BadRequestError, ServiceUnavailableError

from libs.bus.nats import when_jetstream_answers


class Flaky:
    """Fails with each of `errors` in turn, then answers `ok`."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


async def test_not_ready_errors_are_waited_out() -> None:
    call = Flaky(
        nats.errors.TimeoutError(), nats.errors.NoRespondersError(), ServiceUnavailableError()
    )
    assert await when_jetstream_answers("stream X", call, wait_s=30) == "ok"
    assert call.calls == 4


async def test_a_refusal_is_raised_at_once() -> None:
    call = Flaky(BadRequestError(), nats.errors.TimeoutError())
    with pytest.raises(BadRequestError):
        await when_jetstream_answers("stream X", call, wait_s=30)
    assert call.calls == 1


async def test_the_wait_ends() -> None:
    call = Flaky(*[nats.errors.TimeoutError() for _ in range(100)])
    with pytest.raises(nats.errors.TimeoutError):
        await when_jetstream_answers("stream X", call, wait_s=0.5)
    assert 2 <= call.calls < 10
