"""Card lending, the scheduler's writes: commit the loans a round planned (loans.py) and give
lent cards back when their borrower no longer holds them, running a queued wake.

A loan is recorded on the lender first (compare-and-set: still sleeping, released, not lent)
and only then is the borrower placed, so a card is never given to a borrower while its owner
wakes. A borrower that could not be placed after all (it moved since the round read it)
leaves a loan to nobody, which `settle` ends on the next round like any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import structlog

from libs.domain.errors import Code, DomainError
from libs.domain.task.lending import decide_borrow, decide_lend, decide_return
from libs.domain.task.model import Task
from libs.domain.task.states import GPU_HOLDING
from libs.ownership import refuse_foreign
from libs.store import tasks as task_rows
from libs.store.eventstore import EventStore
from libs.store.fenced import FencedWriter

from ..placement.loans import Loan

log = structlog.get_logger(__name__)

# Where the writes go: the term's FencedWriter; the store itself only outside any term (a
# benchmark's placer, which holds no lease).
Writes = FencedWriter | EventStore


async def lend(writes: Writes, loans: Sequence[Loan]) -> list[Task]:
    """Commit each loan (lender, then borrower); the borrowers placed."""
    placed: list[Task] = []
    for loan in loans:
        try:
            await writes.execute(
                loan.lender_task_id,
                partial(
                    decide_lend,
                    borrower_id=loan.borrower_task_id,
                    node_id=loan.node_id,
                    gpu_ids=loan.gpu_ids,
                    borrower_tenant_id=loan.borrower_tenant_id,
                ),
            )
        except DomainError as exc:
            if exc.code is Code.FORBIDDEN:
                refuse_foreign(
                    "loan", exc.message, lender=loan.lender_task_id, borrower=loan.borrower_task_id
                )
            else:
                log.info("loan_refused", lender=loan.lender_task_id, error=exc.message)
            continue
        try:
            borrower = await writes.execute(
                loan.borrower_task_id,
                partial(
                    decide_borrow,
                    lender_id=loan.lender_task_id,
                    node_id=loan.node_id,
                    gpu_ids=loan.gpu_ids,
                    gpu_label=loan.gpu_label,
                ),
            )
        except DomainError as exc:
            log.info("borrow_refused", borrower=loan.borrower_task_id, error=exc.message)
            continue
        log.info(
            "card_lent",
            lender=loan.lender_task_id,
            borrower=loan.borrower_task_id,
            node_id=loan.node_id,
            gpu_ids=list(loan.gpu_ids),
        )
        placed.append(borrower)
    return placed


async def settle(store: EventStore, writes: Writes) -> int:
    """Give back every lent card whose borrower no longer holds it (ended, back to pending,
    gone); a queued wake then runs. Reads from `store`, writes through `writes`. The number
    of cards given back."""
    lenders = await task_rows.lenders(store)
    if not lenders:
        return 0
    found = await task_rows.by_ids(store, [t.lent_to for t in lenders])
    borrowers: dict[str, Task] = {t.id: t for t in found}
    returned = 0
    for lender in lenders:
        borrower = borrowers.get(lender.lent_to)
        if _still_borrowed(lender, borrower):
            continue
        status = borrower.status.value if borrower else "gone"
        try:
            await writes.execute(
                lender.id,
                partial(decide_return, borrower_id=lender.lent_to, borrower_status=status),
            )
        except DomainError as exc:
            log.info("card_return_refused", lender=lender.id, error=exc.message)
            continue
        log.info("lent_card_returned", lender=lender.id, borrower=lender.lent_to, status=status)
        returned += 1
    return returned


def _still_borrowed(lender: Task, borrower: Task | None) -> bool:
    return (
        borrower is not None
        and borrower.status in GPU_HOLDING
        and borrower.borrowed_from == lender.id
    )
