"""Card watching: when a card counts as lost or recovered (pure)."""

from __future__ import annotations

from libs.domain.node.model import CardWatch

LOST_AFTER_MISSES = 3
RECOVERED_AFTER_SIGHTINGS = 2


def watch_card(watch: CardWatch, visible: bool, excluded: bool) -> tuple[CardWatch, str | None]:
    """Advance one card's counters by one heartbeat; return 'lost'/'recovered' on a crossing."""
    if visible:
        nxt = CardWatch(missed=0, seen=watch.seen + 1)
        if excluded and nxt.seen >= RECOVERED_AFTER_SIGHTINGS:
            return CardWatch(), "recovered"
        return nxt, None
    nxt = CardWatch(missed=watch.missed + 1, seen=0)
    if not excluded and nxt.missed >= LOST_AFTER_MISSES:
        return nxt, "lost"
    return nxt, None


def probe_card(passed: int, visible: bool, healthy: bool, needed: int) -> tuple[int, bool]:
    """One health probe of a quarantined card: passes in a row, and whether it returns now.

    A probe passes when the heartbeat shows the card and its health reading is not failed;
    any failed probe starts the count again, so `needed` consecutive passes bring it back.
    """
    if not (visible and healthy):
        return 0, False
    passed += 1
    return passed, passed >= max(1, needed)
