"""NVML's XID events, per card: the device evidence NVML hands out as it happens.

The driver posts every critical XID (`nvmlEventTypeXidCriticalError`) to an event set the
agent registers all its NVIDIA cards with; a thread waits on the set and keeps what comes
(when, which card by UUID, which XID) for `KEEP_S`. When an attempt fails, the XIDs of the
cards it held since it started go into its report (`AgentReport.xids`), and the retry engine
classifies them (libs/domain/task/device_fault.py). Unlike a kernel log line, an event names
its card by UUID, so it is never another task's. A card or driver that does not support the
events is skipped (logged once); without NVML the watch does nothing.

`ecc_counts` reads each card's uncorrectable (double-bit) ECC count since the driver loaded;
the agent reads it when a GPU attempt starts and again when it fails, and a rise becomes a
device line of the attempt's evidence (`ecc_lines`): the classifier's `ecc:dbe`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from .inventory import nvml_session, nvml_text

log = structlog.get_logger(__name__)

KEEP_S = 3600.0
WAIT_MS = 500


class XidWatch:
    """Collects XID events in a thread; `since` answers for a set of cards (thread-safe)."""

    def __init__(self, nvml: Any | None = None, clock: Callable[[], float] = time.time) -> None:
        self.nvml = nvml
        self.clock = clock
        self._seen: deque[tuple[float, str, int]] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def record(self, card: str, xid: int) -> None:
        now = self.clock()
        with self._lock:
            self._seen.append((now, card, xid))
            while self._seen and now - self._seen[0][0] > KEEP_S:
                self._seen.popleft()

    def since(self, cards: Iterable[str], at: float) -> list[int]:
        """The XIDs posted for any of `cards` at or after `at` (wall-clock seconds)."""
        wanted = set(cards)
        with self._lock:
            return [x for t, c, x in self._seen if t >= at and c in wanted]

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """Register every card and wait on the event set until `stop` (blocking: a thread)."""
        with nvml_session(self.nvml) as lib:
            if lib is None:
                return
            events = self._register(lib)
            if events is None:
                return
            try:
                while not self._stop.is_set():
                    self._wait_once(lib, events)
            finally:
                try:
                    lib.nvmlEventSetFree(events)
                except Exception as e:  # noqa: BLE001
                    log.debug("nvml_event_set_free_failed", error=str(e))

    def _register(self, lib: Any) -> Any | None:
        try:
            events = lib.nvmlEventSetCreate()
        except Exception as e:  # noqa: BLE001 - an old driver: no events, no watch
            log.warning("xid_events_unavailable", error=str(e))
            return None
        registered = 0
        for index in range(int(lib.nvmlDeviceGetCount())):
            try:
                handle = lib.nvmlDeviceGetHandleByIndex(index)
                lib.nvmlDeviceRegisterEvents(handle, lib.nvmlEventTypeXidCriticalError, events)
                registered += 1
            except Exception as e:  # noqa: BLE001 - a card without events: the others still
                log.warning("xid_events_not_supported", index=index, error=str(e))
        if not registered:
            lib.nvmlEventSetFree(events)
            return None
        log.info("xid_events_watched", cards=registered)
        return events

    def _wait_once(self, lib: Any, events: Any) -> None:
        try:
            data = lib.nvmlEventSetWait_v2(events, WAIT_MS)
        except lib.NVMLError as e:
            if getattr(e, "value", None) != lib.NVML_ERROR_TIMEOUT:
                log.warning("xid_event_wait_failed", error=str(e))
                self._stop.wait(1.0)  # not a spin on a broken driver
            return
        if int(data.eventType) & int(lib.nvmlEventTypeXidCriticalError):
            card = nvml_text(lib.nvmlDeviceGetUUID(data.device))
            self.record(card, int(data.eventData))
            log.warning("xid_event", gpu_id=card, xid=int(data.eventData))


def ecc_counts(cards: Iterable[str], nvml: Any | None = None) -> dict[str, int]:
    """Uncorrectable volatile ECC errors per card UUID (cards without ECC are left out)."""
    out: dict[str, int] = {}
    with nvml_session(nvml) as lib:
        if lib is None:
            return out
        for card in cards:
            try:
                handle = lib.nvmlDeviceGetHandleByUUID(card)
                out[card] = int(
                    lib.nvmlDeviceGetTotalEccErrors(
                        handle, lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, lib.NVML_VOLATILE_ECC
                    )
                )
            except Exception as e:  # noqa: BLE001 - no ECC on this card, or not an NVML card
                log.debug("ecc_unreadable", gpu_id=card, error=str(e))
    return out


def ecc_lines(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """A device line for each card whose uncorrectable ECC count rose."""
    return [
        f"NVML: {card}: {after[card] - before[card]} new double-bit ECC error(s)"
        for card in sorted(after)
        if card in before and after[card] > before[card]
    ]
