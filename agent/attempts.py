"""The node's durable record of the attempts it started and how each ended: at most one run
per attempt.

A START is acknowledged only once its reports are on the stream, so a START in flight when the
agent died is redelivered (30 s later) to the agent that comes back. What ran of it may be gone
by then: the attempt ended, its exit was reported, and retention removed its container or task
directory, so neither the agent's tracked tasks nor the runtime's own idempotent start can see
that it ran. This record can: the agent writes an attempt's `started` once the runtime holds it
and its final report (exit, start failure, loss) before sending it, and hands an attempt to
retention only once its end is recorded; a START for a recorded attempt is answered from here
instead of running it again (agent/service.py). Between the runtime's start and the record,
the runtime's own idempotent start and the re-adoption after a restart cover the attempt.

The file is an append-only log of JSON lines in the agent's state directory
(`attempts.jsonl`), each line flushed and fsynced before the call returns; a torn last line
(a crash mid-write) is ignored when the log is read. The log is rewritten (temporary file,
fsync, rename, fsync of the directory) once it is half as long again as its live entries
(each attempt writes two lines, so rewrites cost a constant per write on average), and
entries of attempts that ended more than `keep_s` ago are dropped: far longer than a command
can wait on the stream (NODE_MAX_AGE_S), so no START can arrive for a dropped attempt.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from libs.domain.protocol import AgentReport

log = structlog.get_logger(__name__)

FILE = "attempts.jsonl"
Key = tuple[str, int]  # (task id, attempt)
# Lines past the live entries before the log is rewritten, at least (see _compact_if_long).
COMPACT_MIN_LINES = 256


@dataclass(frozen=True)
class Entry:
    """One attempt: when it last changed (wall time) and, once it ended, its final report."""

    at: float
    report: AgentReport | None = None

    @property
    def ended(self) -> bool:
        return self.report is not None


class AttemptRecord:
    def __init__(
        self, state_dir: Path, *, keep_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = state_dir / FILE
        self.keep_s = keep_s
        self.clock = clock
        self._entries: dict[Key, Entry] = {}
        self._lines = 0
        self._lock = threading.Lock()  # the writers run in threads (asyncio.to_thread)
        state_dir.mkdir(parents=True, exist_ok=True)
        self._load()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, task_id: str, attempt: int) -> Entry | None:
        return self._entries.get((task_id, attempt))

    def started(self, task_id: str, attempt: int) -> None:
        """Durably note that the attempt is about to run (or runs: a re-adopted one)."""
        with self._lock:
            if (task_id, attempt) in self._entries:
                return
            at = self.clock()
            self._append({"task": task_id, "attempt": attempt, "at": at})
            self._entries[(task_id, attempt)] = Entry(at)

    def ended(self, report: AgentReport) -> None:
        """Durably keep the attempt's final report (the one a redelivered START gets)."""
        with self._lock:
            at = self.clock()
            line = {"task": report.task_id, "attempt": report.attempt, "at": at}
            self._append(line | {"report": report.model_dump(mode="json")})
            self._entries[(report.task_id, report.attempt)] = Entry(at, report)
            self._compact_if_long()

    def prune(self, live: Callable[[Key], bool]) -> int:
        """Drop entries unchanged for `keep_s` whose attempts are not `live`; how many."""
        if self.keep_s <= 0:
            return 0
        horizon = self.clock() - self.keep_s
        with self._lock:
            old = [k for k, e in self._entries.items() if e.at <= horizon and not live(k)]
            for key in old:
                del self._entries[key]
            if old:
                self._rewrite()
        return len(old)

    # --- the file ------------------------------------------------------------------------

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        torn = 0
        for raw in data.splitlines():
            try:
                key, entry = _parse(json.loads(raw))
            except (ValueError, KeyError, TypeError):
                torn += 1  # a line cut by a crash mid-write: that write never returned
                continue
            self._entries[key] = entry
            self._lines += 1
        if torn:
            log.warning("attempt_record_lines_skipped", path=str(self.path), lines=torn)
        if torn or (data and not data.endswith(b"\n")):
            self._rewrite()  # the next append must not continue a torn line
        else:
            self._compact_if_long()

    def _append(self, line: dict[str, Any]) -> None:
        with self.path.open("ab") as f:
            f.write(json.dumps(line, separators=(",", ":")).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        self._lines += 1

    def _compact_if_long(self) -> None:
        live = len(self._entries)
        if self._lines > live + max(COMPACT_MIN_LINES, live // 2):
            self._rewrite()

    def _rewrite(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            for (task_id, attempt), e in self._entries.items():
                line: dict[str, Any] = {"task": task_id, "attempt": attempt, "at": e.at}
                if e.report is not None:
                    line["report"] = e.report.model_dump(mode="json")
                f.write(json.dumps(line, separators=(",", ":")).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself survives a crash
        finally:
            os.close(fd)
        self._lines = len(self._entries)


def _parse(line: dict[str, Any]) -> tuple[Key, Entry]:
    key = (str(line["task"]), int(line["attempt"]))
    report = line.get("report")
    return key, Entry(float(line["at"]), AgentReport.model_validate(report) if report else None)
