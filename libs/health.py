"""What a process must have done before it says it is ready.

A process (one service, or the agent) is ready when every condition registered here holds
and every durable consumer it is expected to run has started pulling. Conditions are cheap
synchronous checks ("the NATS connection is up", "the HTTP server has bound its port");
reports are conditions that name their own failure ("jetstream_writes": why the last write
probe failed, "relay": why its last round failed), so `/readyz` can say what is wrong;
consumers mark themselves once their pull subscription exists and unmark when they stop, so
a consumer that died makes the process unready again. The application reads this through
its `/readyz` probe; nothing here serves HTTP.

One registry per process (`READINESS`): in `heteroflow up`'s one-process mode every service
writes into the same one and nobody reads it, which costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


class Readiness:
    def __init__(self) -> None:
        self._checks: dict[str, Callable[[], bool]] = {}
        self._consumers: set[str] = set()
        self._reports: dict[str, Callable[[], str | None]] = {}

    def require(self, name: str, check: Callable[[], bool]) -> None:
        """Register (or replace, after a restart) a condition the process needs."""
        self._checks[name] = check

    def report(self, name: str, cause: Callable[[], str | None]) -> None:
        """Register (or replace) a dependency that names its failure: `cause()` is None while
        it holds, else why not, in words."""
        self._reports[name] = cause

    def withdraw(self, name: str) -> None:
        """Remove a report whose owner stopped (a stopped relay is no longer a dependency)."""
        self._reports.pop(name, None)

    def reports(self) -> dict[str, str]:
        """Each report's state: "ok" or its cause (what the gateway's /readyz shows)."""
        return {name: _cause(cause) or "ok" for name, cause in sorted(self._reports.items())}

    def consumer_started(self, durable: str) -> None:
        self._consumers.add(durable)

    def consumer_stopped(self, durable: str) -> None:
        self._consumers.discard(durable)

    def consumers(self) -> frozenset[str]:
        return frozenset(self._consumers)

    def unmet(self, consumers: Iterable[str] = ()) -> list[str]:
        """What is missing, in words; empty when ready."""
        missing = [name for name, check in sorted(self._checks.items()) if not _holds(check)]
        missing += [f"{name}: {state}" for name, state in self.reports().items() if state != "ok"]
        missing += [f"consumer {c} not started" for c in consumers if c not in self._consumers]
        return missing

    def clear(self) -> None:
        self._checks.clear()
        self._consumers.clear()
        self._reports.clear()


def _holds(check: Callable[[], bool]) -> bool:
    try:
        return bool(check())
    except Exception:  # noqa: BLE001 - a check that cannot answer does not hold
        return False


def _cause(cause: Callable[[], str | None]) -> str | None:
    try:
        return cause()
    except Exception as exc:  # noqa: BLE001 - a report that cannot answer names why
        return f"{type(exc).__name__}: {exc}"


READINESS = Readiness()
