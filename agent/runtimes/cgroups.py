"""A cgroup per process-runtime task: memory, CPU and pids limits the kernel enforces.

`detect` finds where this agent can make cgroups, once, at start-up:

* **v2**: the unified hierarchy, where the memory controller can be enabled for a parent the
  agent writes (`<parent>/cgroup.subtree_control`). The parent is `HETEROFLOW_CGROUP_PARENT`,
  else `<the agent's own cgroup>/heteroflow` (a delegated cgroup: systemd `Delegate=yes`), else
  `/heteroflow` at the top of the hierarchy (an agent running as root).
* **v1**: the memory hierarchy (and cpu, pids where mounted) can be written; the same parents,
  one per hierarchy.
* **none**: neither; tasks then run with no memory cap, and the node's inventory says so.

A task's cgroup is `<parent>/<name>`, made by the agent before the job starts, with its limits
written; the job's process joins it before it execs the task's command (process_supervisor),
so everything the command starts is inside. When the job ends its supervisor reads whether the
kernel OOM-killed anything in it, kills what is left and removes the cgroup.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

MODES = ("auto", "v2", "v1", "none")
PERIOD_US = 100_000
_V1_CONTROLLERS = ("memory", "cpu", "pids")


def _mounts(text: str) -> tuple[Path | None, dict[str, Path]]:
    """(the cgroup2 mount, {v1 controller: its mount}) from /proc/self/mounts."""
    unified: Path | None = None
    v1: dict[str, Path] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        point, kind, options = parts[1], parts[2], parts[3].split(",")
        if kind == "cgroup2" and unified is None:
            unified = Path(point)
        elif kind == "cgroup":
            for controller in _V1_CONTROLLERS:
                if controller in options:
                    v1.setdefault(controller, Path(point))
    return unified, v1


def _own(text: str) -> tuple[str, dict[str, str]]:
    """(the v2 path, {v1 controller: path}) of this process, from /proc/self/cgroup."""
    v2 = "/"
    v1: dict[str, str] = {}
    for line in text.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and controllers == "":
            v2 = path or "/"
        for controller in controllers.split(","):
            if controller in _V1_CONTROLLERS:
                v1[controller] = path or "/"
    return v2, v1


def _under(mount: Path, path: str) -> Path:
    return mount / path.lstrip("/")


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _parents(mount: Path, own: str, configured: str) -> list[Path]:
    if configured:
        return [_under(mount, configured)]
    return list(dict.fromkeys([_under(mount, own) / "heteroflow", mount / "heteroflow"]))


def _enable(d: Path) -> None:
    """Enable memory, cpu and pids for `d`'s children, each on its own: cpu can be refused
    (realtime threads outside the root) while memory works. Only memory is required."""
    available = (d / "cgroup.controllers").read_text().split()
    enabled = (d / "cgroup.subtree_control").read_text().split()
    for controller in ("memory", "cpu", "pids"):
        if controller in available and controller not in enabled:
            try:
                _write(d / "cgroup.subtree_control", f"+{controller}")
            except OSError:
                if controller == "memory":
                    raise


def _v2_parent(mount: Path, own: str, configured: str) -> Path | None:
    """A parent under which task cgroups get the memory controller, or None."""
    for parent in _parents(mount, own, configured):
        try:
            if "memory" not in (parent.parent / "cgroup.controllers").read_text().split():
                continue
            _enable(parent.parent)
            parent.mkdir(exist_ok=True)
            _enable(parent)
            if "memory" in (parent / "cgroup.subtree_control").read_text().split():
                return parent
        except OSError as e:
            log.debug("cgroup v2 parent not usable", parent=str(parent), error=str(e))
    return None


def _v1_parent(mount: Path, own: str, configured: str) -> Path | None:
    for parent in _parents(mount, own, configured):
        try:
            parent.mkdir(parents=True, exist_ok=True)
            probe = parent / f"probe-{os.getpid()}"
            probe.mkdir(exist_ok=True)
            probe.rmdir()
            return parent
        except OSError as e:
            log.debug("cgroup v1 parent not usable", parent=str(parent), error=str(e))
    return None


@dataclass(frozen=True)
class Cgroups:
    """Where this node makes task cgroups; `mode` is what the inventory reports."""

    mode: str = "none"
    v2: Path | None = None
    v1: dict[str, Path] = field(default_factory=dict)  # controller → parent

    def make(
        self, name: str, *, memory_mb: int, cpu_cores: float, pids: int
    ) -> dict[str, Any] | None:
        """The task's cgroup with its limits written: the request's `cgroup` entry (mode, the
        directories, the one that counts OOM kills), or None in mode none. On a failed write
        nothing is left behind and OSError says which file."""
        if self.mode == "none":
            return None
        made: list[Path] = []
        try:
            if self.v2 is not None:
                d = self.v2 / name
                d.mkdir()
                made.append(d)
                self._limits_v2(d, memory_mb, cpu_cores, pids)
                memory = d
            else:
                memory = self.v1["memory"] / name
                for parent in dict.fromkeys(self.v1.values()):  # co-mounted: one directory
                    d = parent / name
                    d.mkdir()
                    made.append(d)
                self._limits_v1(name, memory_mb, cpu_cores, pids)
        except OSError:
            remove([str(d) for d in made])
            raise
        return {"mode": self.mode, "dirs": [str(d) for d in made], "memory": str(memory)}

    @staticmethod
    def _limits_v2(d: Path, memory_mb: int, cpu_cores: float, pids: int) -> None:
        if memory_mb > 0:
            _write(d / "memory.max", str(memory_mb * 1024 * 1024))
            if (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", "0")  # like a container: no swap, an OOM kill
            if (d / "memory.oom.group").exists():
                _write(d / "memory.oom.group", "1")  # an OOM kill takes the whole task
        if cpu_cores > 0 and (d / "cpu.max").exists():
            _write(d / "cpu.max", f"{max(1000, round(cpu_cores * PERIOD_US))} {PERIOD_US}")
        if pids > 0 and (d / "pids.max").exists():
            _write(d / "pids.max", str(pids))

    def _limits_v1(self, name: str, memory_mb: int, cpu_cores: float, pids: int) -> None:
        mem = self.v1["memory"] / name
        if memory_mb > 0:
            limit = str(memory_mb * 1024 * 1024)
            _write(mem / "memory.limit_in_bytes", limit)
            if (mem / "memory.memsw.limit_in_bytes").exists():
                _write(mem / "memory.memsw.limit_in_bytes", limit)  # no swap beyond the limit
        if cpu_cores > 0 and "cpu" in self.v1:
            cpu = self.v1["cpu"] / name
            _write(cpu / "cpu.cfs_period_us", str(PERIOD_US))
            _write(cpu / "cpu.cfs_quota_us", str(max(1000, round(cpu_cores * PERIOD_US))))
        if pids > 0 and "pids" in self.v1:
            _write(self.v1["pids"] / name / "pids.max", str(pids))


def detect(
    mode: str = "auto",
    parent: str = "",
    *,
    mounts: str | None = None,
    own: str | None = None,
) -> Cgroups:
    """Where task cgroups can be made (see the module docstring). `mode` v2 or v1 asks for
    that one only (none when it cannot be written); `none` turns cgroups off."""
    if mode not in MODES:
        raise ValueError(f"HETEROFLOW_CGROUPS: {mode!r} is not one of {', '.join(MODES)}")
    if mode == "none":
        return Cgroups()
    try:
        mounts = Path("/proc/self/mounts").read_text() if mounts is None else mounts
        own = Path("/proc/self/cgroup").read_text() if own is None else own
    except OSError:
        return Cgroups()
    unified, v1_mounts = _mounts(mounts)
    own_v2, own_v1 = _own(own)
    if mode in ("auto", "v2") and unified is not None:
        found = _v2_parent(unified, own_v2, parent)
        if found is not None:
            return Cgroups(mode="v2", v2=found)
    if mode in ("auto", "v1") and "memory" in v1_mounts:
        parents: dict[str, Path] = {}
        for controller, mount in v1_mounts.items():
            found = _v1_parent(mount, own_v1.get(controller, "/"), parent)
            if found is not None:
                parents[controller] = found
        if "memory" in parents:
            return Cgroups(mode="v1", v1=parents)
    log.warning("no writable cgroup: process tasks run without a memory cap", mode=mode)
    return Cgroups()


def remove(dirs: list[str], within_s: float = 2.0) -> bool:
    """Kill what is left in each cgroup and remove it (killed processes take a moment to
    leave it); True when all are gone."""
    deadline = time.monotonic() + within_s
    gone = True
    for d in dirs:
        path = Path(d)
        pause = 0.0002
        while path.exists():
            with contextlib.suppress(OSError):
                for pid in (path / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), 9)
            try:
                path.rmdir()
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    gone = False
                    break
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
    return gone
