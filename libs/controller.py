"""The controller runtime: one home for leader-only control loops.

A controller (node monitor, group controller, placement, AutoScaler, rollout, schedule
windows) says what one evaluation does; the runtime does the rest, the same way for all:

* contends for the controller's lease (libs/bus/lease.py) and renews it while held;
* for each term of leadership, builds the `Fence` (lease name + fencing token) that every
  write of that term must carry, and shows it to the store before anything else (`claim`):
  from then on the store refuses a write of any older holder (libs/store/fencing.py);
* evaluates periodically (libs/periodic.py), with an injectable clock for the controller's
  sense of time;
* ends the term when the lease is lost, when the store answers `Fenced`, or when the
  controller fails outside an evaluation, and then contends again: a deposed leader stops
  acting at once, and a new term gets a new token.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from libs.bus.lease import LeaseLike, run_while_leader
from libs.domain.errors import Fenced
from libs.periodic import periodic, wait_or_stop
from libs.store import fencing
from libs.store.eventstore import EventStore
from libs.store.fenced import FencedWriter
from libs.store.fencing import Fence

log = structlog.get_logger(__name__)

Clock = Callable[[], float]
T = TypeVar("T")
R = TypeVar("R")
Claim = Callable[[Fence], Awaitable[None]]


@dataclass(frozen=True)
class Term:
    """One tenure of leadership: the fence its writes carry, the store view that carries it
    (`writer`, when the runtime was given the store) and the runtime's clock."""

    fence: Fence
    elected_at: float
    clock: Clock
    store: EventStore | None = None

    def now(self) -> float:
        return self.clock()

    @property
    def writer(self) -> FencedWriter:
        """The store, every write under this term's fence (libs/store/fenced.py)."""
        if self.store is None:
            raise RuntimeError("this controller runtime was started without a store")
        return FencedWriter(self.store, self.fence)


class Controller(ABC):
    """A leader-only control loop: `evaluate` runs every `interval_s` while we lead.

    `evaluate` returning True asks for the next pass at once (more work); setting `wake`
    cuts the wait short. Writes go through `term.writer` (or pass `term.fence`); a store
    write made anywhere within the term without a fence carries the term's all the same.
    """

    name: str = "controller"
    interval_s: float = 1.0
    error_backoff_s: float | None = None
    wake: asyncio.Event | None = None
    fence: Fence | None = None  # the current term's, for the store calls of a pass

    async def elected(self, term: Term) -> None:
        """A term begins: keep its fence; a controller with more in memory rebuilds it here
        too (and keeps the fence itself)."""
        self.fence = term.fence

    @abstractmethod
    async def evaluate(self, term: Term) -> bool | None:
        """One pass of the loop."""

    async def deposed(self) -> None:  # noqa: B027 - optional hook
        """The term ended (lease lost, fenced off, stopping): drop what `elected` set up."""


async def for_each(
    items: Iterable[T], act: Callable[[T], Awaitable[R]], failed: str
) -> list[tuple[T, R]]:
    """`act` on every item of a pass, in turn, with each result. A `Fenced` ends the pass
    at once (deposed: nothing more may be written); any other error is logged as `failed`
    with the item's id and the pass goes on to the next item."""
    done: list[tuple[T, R]] = []
    for item in items:
        try:
            done.append((item, await act(item)))
        except Fenced:
            raise
        except Exception:
            item_id: Any = getattr(item, "id", item)
            log.exception(failed, item_id=item_id)
    return done


async def run_controller(
    controller: Controller,
    lease: LeaseLike,
    stop: asyncio.Event,
    *,
    renew_every: float,
    retry_every: float | None = None,
    clock: Clock = time.monotonic,
    claim: Claim | None = None,
    store: EventStore | None = None,
) -> None:
    """Run `controller` whenever we hold `lease`, until `stop` is set.

    `claim` (the store's `claim_fence`) records each new term's fence before the term acts;
    `store` gives each term its `writer` and is claimed on when `claim` is not given.
    """
    retry = retry_every if retry_every is not None else renew_every
    if claim is None and store is not None:
        claim = store.claim_fence

    async def term_body(token: int) -> None:
        term = Term(Fence(lease.name, token), clock(), clock, store)
        await _serve_term(controller, term, claim)

    while not stop.is_set():
        # Returns when `stop` is set, or when a term ended by itself (fenced, failed): the
        # lease is released by then; pause before contending again so a failing controller
        # does not spin on the lease.
        await run_while_leader(lease, term_body, stop, renew_every=renew_every, retry_every=retry)
        await wait_or_stop(stop, retry)


async def _serve_term(controller: Controller, term: Term, claim: Claim | None) -> None:
    """Evaluate until the term ends. Cancelled when the lease is lost or `stop` is set."""
    ended = asyncio.Event()
    bound = log.bind(controller=controller.name, lease=term.fence.lease, token=term.fence.token)

    async def one_pass() -> bool | None:
        try:
            return await controller.evaluate(term)
        except Fenced as exc:
            bound.warning("controller_fenced", newest=exc.newest)
            ended.set()
            return False

    bound.info("controller_elected")
    # Every store write of the term (and of tasks it starts) carries its fence.
    ambient = fencing.TERM_FENCE.set(term.fence)
    try:
        if claim is not None:
            await claim(term.fence)
        await controller.elected(term)
        await periodic(
            controller.name,
            one_pass,
            ended,
            controller.interval_s,
            wake=controller.wake,
            error_backoff_s=controller.error_backoff_s,
        )
    except Fenced as exc:
        bound.warning("controller_fenced", newest=exc.newest)
    except Exception:
        bound.exception("controller_failed")
    finally:
        await controller.deposed()
        fencing.TERM_FENCE.reset(ambient)
        bound.info("controller_deposed")
