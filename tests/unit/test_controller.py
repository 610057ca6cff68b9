"""The controller runtime with a fake lease and a manual clock: a term's fence and clock reach
every evaluation; a lost lease, a fenced write or a failure ends the term; `stop` deposes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from libs.controller import Controller, Term, for_each, run_controller
from libs.domain.errors import Fenced
from libs.store.fencing import Fence
from services.scheduler.controllers.groups import GroupController, policy_from
from tests.wait import wait_until_async

FAST = 0.01


class FakeLease:
    """A lease that someone else may hold (`available`) and that may be taken from us."""

    def __init__(self, name: str = "ctl") -> None:
        self.name = name
        self.available = True
        self.attempts = 0
        self.releases = 0
        self._token: int | None = None
        self._next = 1

    @property
    def fencing_token(self) -> int | None:
        return self._token

    @property
    def held(self) -> bool:
        return self._token is not None

    async def acquire(self) -> bool:
        self.attempts += 1
        if self._token is not None:
            return await self.renew()
        if not self.available:
            return False
        self._token, self._next = self._next, self._next + 1
        return True

    async def renew(self) -> bool:
        if not self.available:
            self._token = None  # someone else has it now
        return self._token is not None

    async def release(self) -> None:
        if self._token is not None:
            self.releases += 1
        self._token = None


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 1.0  # every reading moves on, so each pass sees its own time
        return self.now


class Recorder(Controller):
    name = "recorder"
    interval_s = FAST

    def __init__(self) -> None:
        self.passes: list[tuple[int, float]] = []
        self.elections: list[Term] = []
        self.depositions = 0
        self.raise_on: Callable[[Term, int], BaseException | None] = lambda _t, _n: None
        self.fail_election = 0

    async def elected(self, term: Term) -> None:
        self.elections.append(term)
        if self.fail_election:
            self.fail_election -= 1
            raise RuntimeError("could not load the cluster")

    async def evaluate(self, term: Term) -> None:
        exc = self.raise_on(term, len(self.passes))
        if exc is not None:
            raise exc
        self.passes.append((term.fence.token, term.now()))

    async def deposed(self) -> None:
        self.depositions += 1


def start(
    ctl: Controller, lease: FakeLease, clock: Callable[[], float] = time.monotonic
) -> tuple[asyncio.Event, asyncio.Task[None]]:
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_controller(ctl, lease, stop, renew_every=FAST, retry_every=FAST, clock=clock)
    )
    return stop, task


async def finish(stop: asyncio.Event, task: asyncio.Task[None]) -> None:
    stop.set()
    await asyncio.wait_for(task, 5.0)


async def test_each_pass_gets_the_terms_fence_and_the_injected_clock() -> None:
    ctl, lease, clock = Recorder(), FakeLease("node-monitor"), ManualClock()
    stop, task = start(ctl, lease, clock)
    await wait_until_async(lambda: len(ctl.passes) >= 3, 5.0, FAST / 2, "three passes")
    await finish(stop, task)
    (term,) = ctl.elections
    assert term.fence == Fence("node-monitor", 1)
    assert term.elected_at > 1000.0
    times = [at for _, at in ctl.passes]
    assert times == sorted(times) and min(times) > term.elected_at  # read from the fake clock
    assert {token for token, _ in ctl.passes} == {1}
    assert ctl.depositions == 1 and lease.releases == 1 and not lease.held


async def test_without_the_lease_nothing_is_evaluated() -> None:
    ctl, lease = Recorder(), FakeLease()
    lease.available = False
    stop, task = start(ctl, lease)
    await wait_until_async(lambda: lease.attempts >= 5, 5.0, FAST / 2, "five attempts at the lease")
    await finish(stop, task)
    assert ctl.passes == [] and ctl.elections == []


async def test_a_fenced_write_ends_the_term_and_the_next_term_has_a_new_token() -> None:
    ctl, lease = Recorder(), FakeLease()
    ctl.raise_on = lambda term, n: Fenced("ctl", 1, 7) if term.fence.token == 1 and n == 2 else None
    stop, task = start(ctl, lease)
    await wait_until_async(
        lambda: any(token == 2 for token, _ in ctl.passes),
        5.0,
        FAST / 2,
        "a pass of the second term",
    )
    await finish(stop, task)
    tokens = [token for token, _ in ctl.passes]
    assert tokens[:2] == [1, 1] and set(tokens[2:]) == {2}  # nothing more under token 1
    assert [t.fence.token for t in ctl.elections] == [1, 2]
    assert ctl.depositions == 2


async def test_a_lost_lease_stops_evaluation() -> None:
    ctl, lease = Recorder(), FakeLease()
    stop, task = start(ctl, lease)
    await wait_until_async(lambda: len(ctl.passes) >= 2, 5.0, FAST / 2, "two passes")
    lease.available = False  # another holder took over
    await wait_until_async(lambda: ctl.depositions == 1, 5.0, FAST / 2, "the term to end")
    after = len(ctl.passes)
    tried = lease.attempts
    await wait_until_async(
        lambda: lease.attempts >= tried + 5, 5.0, FAST / 2, "five more attempts at the lease"
    )
    await finish(stop, task)
    assert len(ctl.passes) == after
    assert len(ctl.elections) == 1


async def test_a_failure_outside_a_pass_ends_the_term_and_it_contends_again() -> None:
    ctl, lease = Recorder(), FakeLease()
    ctl.fail_election = 1
    stop, task = start(ctl, lease)
    await wait_until_async(lambda: bool(ctl.passes), 5.0, FAST / 2, "a pass")
    await finish(stop, task)
    assert [t.fence.token for t in ctl.elections] == [1, 2]
    assert {token for token, _ in ctl.passes} == {2}


async def test_a_failing_pass_does_not_end_the_term() -> None:
    ctl, lease = Recorder(), FakeLease()
    failed = False

    def once(_term: Term, n: int) -> BaseException | None:
        nonlocal failed
        if n == 1 and not failed:
            failed = True
            return RuntimeError("database blip")
        return None

    ctl.raise_on = once
    stop, task = start(ctl, lease)
    await wait_until_async(lambda: len(ctl.passes) >= 3, 5.0, FAST / 2, "passes after the failure")
    await finish(stop, task)
    assert failed and len(ctl.elections) == 1


@pytest.mark.parametrize(
    ("readings", "rebuilds"),
    [
        ([0.0, 1.0, 2.0], [True, False, False]),
        ([0.0, 9.9, 10.0, 15.0, 20.0], [True, False, True, False, True]),
    ],
    ids=["within-10s", "every-10s"],
)
async def test_group_rebuilds_follow_the_term_clock(
    readings: list[float], rebuilds: list[bool]
) -> None:
    """Inference rebuilds run every `rebuild_every_s` by the runtime's clock, the first at once."""
    seen: list[bool] = []

    class Scans(GroupController):
        async def scan(self, *, allow_rebuild: bool = False) -> int:
            seen.append(allow_rebuild)
            return 0

    ctl = Scans(None, policy_from([60.0], 600, 1800, 5), lambda: datetime.now(UTC))  # type: ignore[arg-type]
    values = iter(readings)
    term = Term(Fence("group-controller", 3), 0.0, lambda: next(values))
    await ctl.elected(term)
    for _ in readings:
        await ctl.evaluate(term)
    assert seen == rebuilds
    assert ctl.fence == Fence("group-controller", 3)


async def test_a_term_shows_its_fence_before_acting_and_ends_if_it_is_stale() -> None:
    ctl, lease = Recorder(), FakeLease()
    claimed: list[Fence] = []

    async def claim(fence: Fence) -> None:
        claimed.append(fence)
        if fence.token == 1:
            raise Fenced(fence.lease, fence.token, 5)  # a newer holder wrote already

    stop = asyncio.Event()
    task = asyncio.create_task(
        run_controller(ctl, lease, stop, renew_every=FAST, retry_every=FAST, claim=claim)
    )
    await wait_until_async(lambda: bool(ctl.passes), 5.0, FAST / 2, "a pass")
    await finish(stop, task)
    assert [f.token for f in claimed] == [1, 2]
    assert [t.fence.token for t in ctl.elections] == [2]  # the stale term never began
    assert {token for token, _ in ctl.passes} == {2}


async def test_a_pass_goes_on_past_a_failing_item_but_stops_when_fenced() -> None:
    seen: list[int] = []

    async def act(n: int) -> int:
        seen.append(n)
        if n == 2:
            raise RuntimeError("this one item is broken")
        if n == 4:
            raise Fenced("controller", 1, 2)
        return n * 10

    assert await for_each([1, 2, 3], act, "failed") == [(1, 10), (3, 30)]
    seen.clear()
    with pytest.raises(Fenced):
        await for_each([3, 4, 5], act, "failed")
    assert seen == [3, 4]  # nothing after the fence


async def test_a_new_term_hands_its_fence_to_the_controller() -> None:
    class Plain(Controller):
        async def evaluate(self, term: Term) -> None:
            return None

    c = Plain()
    fence = Fence("plain", 7)
    await c.elected(Term(fence, 0.0, time.monotonic))
    assert c.fence == fence
