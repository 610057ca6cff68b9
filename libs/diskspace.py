"""Free space under the state directory, and the threshold below which writes are shed.

`HETEROFLOW_HOME` holds the embedded servers' data (the JetStream store, the PostgreSQL
cluster). A disk that fills up breaks both in ways that outlive the full disk (a JetStream
stream that met a write error refuses every write until nats-server restarts), so the
gateway stops taking writes a little before: below the threshold each write is answered 503
with `Retry-After` (services/api_gateway/shedding.py) and `/readyz` names the free space.

The threshold is the smaller of `HETEROFLOW_DISK_MIN_FREE_MB` (500) and
`HETEROFLOW_DISK_MIN_FREE_PERCENT` (5) of the file system's size: 500 MB on any disk of 10 GB
or more, 5 % on a smaller one (10 MB of a 200 MB volume). Either at 0 turns shedding off.
Readings are cached for `CACHE_S` (one `statvfs` per interval, whatever the request rate).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import Gauge

FREE = Gauge(
    "heteroflow_home_free_bytes",
    "Free space (for unprivileged users) on the file system of HETEROFLOW_HOME",
)
THRESHOLD = Gauge(
    "heteroflow_home_free_threshold_bytes",
    "Free space under HETEROFLOW_HOME below which the gateway sheds writes (0 = never)",
)

CACHE_S = 0.5
MB = 1024 * 1024
RETRY_AFTER_S = 5


@dataclass(frozen=True)
class Reading:
    free_bytes: int
    total_bytes: int
    threshold_bytes: int

    @property
    def low(self) -> bool:
        return self.free_bytes < self.threshold_bytes

    def cause(self) -> str | None:
        """Why writes are shed, in words; None while there is room."""
        if not self.low:
            return None
        return (
            f"{self.free_bytes / MB:.1f} MB free under HETEROFLOW_HOME, below the threshold "
            f"of {self.threshold_bytes / MB:.1f} MB"
        )


def threshold_bytes(total_bytes: int, min_free_mb: float, min_free_percent: float) -> int:
    """The smaller of the two settings; 0 (never shed) when either is 0."""
    if min_free_mb <= 0 or min_free_percent <= 0:
        return 0
    return int(min(min_free_mb * MB, total_bytes * min_free_percent / 100))


@dataclass
class DiskSpace:
    """Free space on the file system holding `path`, read at most every `CACHE_S`."""

    path: Path
    min_free_mb: float = 500.0
    min_free_percent: float = 5.0
    clock: Callable[[], float] = time.monotonic
    _last: Reading | None = field(default=None, init=False, repr=False)
    _at: float = field(default=0.0, init=False, repr=False)

    def read(self) -> Reading:
        now = self.clock()
        if self._last is not None and now - self._at < CACHE_S:
            return self._last
        st = os.statvfs(_existing(self.path))
        total = st.f_blocks * st.f_frsize
        reading = Reading(
            free_bytes=st.f_bavail * st.f_frsize,
            total_bytes=total,
            threshold_bytes=threshold_bytes(total, self.min_free_mb, self.min_free_percent),
        )
        FREE.set(reading.free_bytes)
        THRESHOLD.set(reading.threshold_bytes)
        self._last, self._at = reading, now
        return reading

    def cause(self) -> str | None:
        """Why writes are shed now; None while there is room (or the path cannot be read:
        a state directory not made yet holds no data to protect)."""
        try:
            return self.read().cause()
        except OSError:
            return None


def _existing(path: Path) -> Path:
    """`path`, or its nearest existing parent (the same file system until it is made)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return path
