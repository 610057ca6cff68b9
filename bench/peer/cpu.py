"""Control-plane CPU time of a set of processes, read from /proc (through psutil).

A sample sums, over every process of the set alive at that moment, its own user and system
time plus the time of the children it has reaped (`cutime`/`cstime`). The difference of two
samples is then the CPU the set used in between, including short-lived helpers that were
born and reaped in the window (PostgreSQL backends, the process runtime's per-task
supervisors), and never counts a live child twice (a child's time joins its parent's only
once reaped). A helper whose reaper is outside the set is missed after it exits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import psutil


@dataclass(frozen=True)
class CpuSample:
    seconds: float  # the set's total
    by_name: dict[str, float] = field(default_factory=dict)  # per process name, for the notes


def cpu_seconds(pids: Iterable[int]) -> CpuSample:
    total = 0.0
    by_name: dict[str, float] = {}
    for pid in set(pids):
        try:
            proc = psutil.Process(pid)
            t = proc.cpu_times()
            name = proc.name()
        except psutil.Error:
            continue  # gone between listing and reading: its reaper has it now
        used = t.user + t.system + t.children_user + t.children_system
        total += used
        by_name[name] = by_name.get(name, 0.0) + used
    return CpuSample(total, by_name)


def delta(before: CpuSample, after: CpuSample) -> CpuSample:
    names = before.by_name.keys() | after.by_name.keys()
    return CpuSample(
        after.seconds - before.seconds,
        {n: after.by_name.get(n, 0.0) - before.by_name.get(n, 0.0) for n in sorted(names)},
    )


def tree(
    roots: Iterable[int],
    also: Callable[[list[str]], bool] = lambda _cmdline: False,
    prune: Callable[[list[str]], bool] = lambda _cmdline: False,
) -> list[int]:
    """`roots`, every process whose command line `also` accepts, and all their descendants,
    except the children of a process `prune` accepts (the work it runs is not the control
    plane's; the pruned process itself is)."""
    procs: dict[int, tuple[int, list[str]]] = {}
    for p in psutil.process_iter(["pid", "ppid", "cmdline"]):
        procs[p.info["pid"]] = (p.info["ppid"] or 0, p.info["cmdline"] or [])
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    todo = [pid for pid in roots if pid in procs]
    todo += [pid for pid, (_, cmd) in procs.items() if also(cmd)]
    seen: set[int] = set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        if not prune(procs[pid][1]):
            todo.extend(children.get(pid, ()))
    return sorted(seen)


class Sampler:
    """CPU of short-lived processes no process of ours reaps (Slurm's per-job slurmstepd):
    every `every_s`, each process named in `names` is read and the highest figure seen per
    pid kept. The last moments of a process between two samples are missed: a floor."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(names)
        self.seen: dict[int, float] = {}

    def sample(self) -> None:
        for p in psutil.process_iter(["name", "cpu_times"]):
            t = p.info["cpu_times"]
            if p.info["name"] in self.names and t is not None:
                used = t.user + t.system + t.children_user + t.children_system
                self.seen[p.pid] = max(used, self.seen.get(p.pid, 0.0))

    @property
    def seconds(self) -> float:
        return sum(self.seen.values())
