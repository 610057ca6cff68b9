"""Where the agent reads device evidence: the kernel log lines a card fault leaves.

NVIDIA's driver logs every XID as `NVRM: Xid (PCI:…): N, …` in the kernel log, a card that
left the bus as "GPU has fallen off the bus", amdgpu its RAS (uncorrectable error) and reset
failures; the retry engine classifies them (libs/domain/task/device_fault.py). The agent
marks the log's position when a GPU attempt starts and, when the attempt fails, hands over the
device lines written since. The source is `dmesg` (the kernel ring buffer; it needs
CAP_SYSLOG or `kernel.dmesg_restrict=0`, and reads nothing otherwise), or a file named by
`HETEROFLOW_KERNEL_LOG` (`/var/log/kern.log`, a journald export, or the file a simulated
node's faults are written to).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

DEVICE_LINE = re.compile(
    r"NVRM: Xid|GPU has fallen off the bus|double[- ]bit ECC|uncorrectable ECC"
    r"|amdgpu[^\n]*(?:uncorrectable hardware error|GPU reset\(\d+\) failed|Fatal error)"
    r"|Memory access fault by GPU node",
    re.I,
)
MAX_LINES = 20
DMESG_TIMEOUT_S = 2.0


def device_lines(lines: list[str]) -> list[str]:
    """The lines that carry device evidence, the last `MAX_LINES` of them."""
    return [line for line in lines if DEVICE_LINE.search(line)][-MAX_LINES:]


class KernelLog:
    """Positions in the kernel log, and the device lines written after one (blocking calls)."""

    def __init__(self, path: Path | None = None, *, use_dmesg: bool = True) -> None:
        self.path = path
        self.use_dmesg = use_dmesg and path is None
        self._warned = False

    def mark(self) -> int:
        """The log's current end: a byte offset in the file, or dmesg's line count."""
        if self.path is not None:
            try:
                return self.path.stat().st_size
            except OSError:
                return 0
        return len(self._dmesg())

    def since(self, mark: int) -> list[str]:
        """Device lines written after `mark` (all the log's when it shrank: it rotated)."""
        if mark < 0:
            return []
        if self.path is not None:
            try:
                with self.path.open("rb") as f:
                    size = f.seek(0, 2)
                    f.seek(mark if mark <= size else 0)
                    text = f.read().decode("utf-8", "replace")
            except OSError:
                return []
            return device_lines(text.splitlines())
        lines = self._dmesg()
        return device_lines(lines[mark:] if mark <= len(lines) else lines)

    def _dmesg(self) -> list[str]:
        if not self.use_dmesg:
            return []
        try:
            done = subprocess.run(
                ["dmesg"], capture_output=True, text=True, timeout=DMESG_TIMEOUT_S, check=True
            )
        except (OSError, subprocess.SubprocessError) as exc:
            if not self._warned:
                self._warned = True
                log.warning("kernel_log_unreadable", error=str(exc))
            self.use_dmesg = False
            return []
        return done.stdout.splitlines()
