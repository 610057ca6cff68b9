"""Process-runtime limits through a cgroup per task, on this host's real cgroup hierarchies:
address space is never limited, memory is, an allocation past `memory_mb` is an OOM kill
reported as such, the limits are those of the task, and the cgroup goes when the task ends.
Skipped, with the reason, on a host where the agent can write no cgroup (the runtime then
says `none`, which the last test checks on every host)."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.runtimes import cgroups
from agent.runtimes.base import RunSpec, RunState, RuntimeStartError
from agent.runtimes.process import ProcessRuntime

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="the process runtime is Linux-only"
    ),
]

# Touches every page: the memory is really used, not only reserved.
ALLOCATE_300MB = f"{sys.executable} -c 'x = b\"x\" * (300 << 20); print(len(x))'"


def spec(command: str, **kw: object) -> RunSpec:
    return RunSpec.model_validate(
        {"task_id": f"c{uuid.uuid4().hex[:10]}", "attempt": 0, "image": "none", "command": command}
        | kw
    )


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[ProcessRuntime]:
    runtime = ProcessRuntime(tmp_path / "state", poll_s=0.05)
    if runtime.cgroups.mode == "none":
        pytest.skip("no cgroup hierarchy with a memory controller can be written on this host")
    yield runtime
    for handle in await runtime.list_managed():
        await runtime.remove(handle)
    await runtime.close()


def _cgroup(rt: ProcessRuntime, s: RunSpec) -> dict[str, object]:
    import json

    state = json.loads((rt.tasks_dir / f"{s.task_id}-{s.attempt}" / "state.json").read_text())
    found: dict[str, object] = state["cgroup"]
    return found


def _exists(path: Path) -> bool:
    return path.exists()


async def test_reserving_address_space_is_not_using_memory(rt: ProcessRuntime) -> None:
    # What JAX, the JVM and CUDA do at start: map far more than the task's memory. Under
    # RLIMIT_AS (memory_mb as an address-space limit) this fails with ENOMEM.
    cmd = f"{sys.executable} -c 'import mmap; m = mmap.mmap(-1, 8 << 30); print(\"mapped\")'"
    report = await rt.wait(await rt.start(spec(cmd, memory_mb=2048)))
    assert (report.exit_code, report.output_tail) == (0, ["mapped"]), report


async def test_using_more_than_memory_mb_is_an_oom_kill(rt: ProcessRuntime) -> None:
    s = spec(ALLOCATE_300MB, memory_mb=64)
    report = await rt.wait(await rt.start(s))
    # Killed by the kernel (SIGKILL, the shell exits 137), not a MemoryError: the cgroup's
    # OOM count is the evidence.
    assert report.exit_code == 137 and report.oom_killed, report
    assert not any("MemoryError" in line for line in report.output_tail)
    # The same at a limit that holds it: it runs.
    fine = await rt.wait(await rt.start(spec(ALLOCATE_300MB, memory_mb=1024)))
    assert (fine.exit_code, fine.oom_killed, fine.output_tail) == (0, False, [str(300 << 20)])


async def test_the_limits_are_the_tasks_and_the_cgroup_goes_with_it(rt: ProcessRuntime) -> None:
    s = spec("cat /proc/self/cgroup", memory_mb=300, cpu_cores=1.5)
    h = await rt.start(s)
    cgroup = _cgroup(rt, s)
    dirs = [Path(str(d)) for d in cgroup["dirs"]]  # type: ignore[attr-defined]
    memory = Path(str(cgroup["memory"]))
    report = await rt.wait(h)
    assert report.exit_code == 0
    name = memory.name
    assert name.startswith(f"{s.task_id}-0-")
    if rt.cgroups.mode == "v2":
        assert report.output_tail[-1].endswith(f"/{name}")
    else:
        memory_line = next(line for line in report.output_tail if ":memory:" in line)
        assert memory_line.endswith(f"/{name}")
    # Gone once the task has ended (the supervisor removes it before recording the exit).
    assert [d for d in dirs if d.exists()] == []


async def test_the_limits_written_while_it_runs(rt: ProcessRuntime) -> None:
    s = spec("exec sleep 30", memory_mb=300, cpu_cores=1.5)
    h = await rt.start(s)
    try:
        memory = Path(str(_cgroup(rt, s)["memory"]))
        assert h.id in (memory / "cgroup.procs").read_text().split()
        if rt.cgroups.mode == "v2":
            assert (memory / "memory.max").read_text().strip() == str(300 << 20)
            assert (memory / "cpu.max").read_text().split() == ["150000", "100000"]
            assert (memory / "pids.max").read_text().strip() == "4096"
        else:
            assert (memory / "memory.limit_in_bytes").read_text().strip() == str(300 << 20)
            cpu = rt.cgroups.v1.get("cpu")
            if cpu is not None:
                quota = (cpu / memory.name / "cpu.cfs_quota_us").read_text().strip()
                assert quota == "150000"
            pids = rt.cgroups.v1.get("pids")
            if pids is not None:
                assert (pids / memory.name / "pids.max").read_text().strip() == "4096"
    finally:
        await rt.remove(h)
    assert not _exists(memory)  # removed with the task, even one stopped while running


async def test_without_cgroups_the_node_says_so_and_nothing_caps_memory(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path / "state", poll_s=0.05, cgroups="none")
    try:
        assert rt.node_facts() == {"cgroups": "none"}
        report = await rt.wait(await rt.start(spec(ALLOCATE_300MB, memory_mb=64)))
        assert (report.exit_code, report.oom_killed) == (0, False), report
    finally:
        await rt.close()


def test_a_host_with_no_writable_hierarchy_is_none(tmp_path: Path) -> None:
    # Mounted where nothing can be made: a file stands where each parent would go.
    (tmp_path / "heteroflow").write_text("")
    mounts = f"cgroup {tmp_path} cgroup rw,memory 0 0\ncgroup2 {tmp_path} cgroup2 rw 0 0\n"
    found = cgroups.detect("auto", mounts=mounts, own="4:memory:/\n0::/\n")
    assert found.mode == "none"
    with pytest.raises(ValueError, match="HETEROFLOW_CGROUPS"):
        cgroups.detect("v3")


async def test_a_restarted_agent_removes_the_cgroups_dead_supervisors_left(
    rt: ProcessRuntime, tmp_path: Path
) -> None:
    import json
    import os
    import signal

    killed = spec("exec sleep 30", memory_mb=64)
    running = spec("exec sleep 30", memory_mb=64)
    hk, hr = await rt.start(killed), await rt.start(running)
    pids = json.loads((rt.tasks_dir / f"{killed.task_id}-0" / "pids.json").read_text())
    for pid in (pids["supervisor_pid"], pids["pid"]):  # as `kill -9` of both would
        os.kill(pid, signal.SIGKILL)
    left = Path(str(_cgroup(rt, killed)["memory"]))
    kept = Path(str(_cgroup(rt, running)["memory"]))
    deadline = asyncio.get_running_loop().time() + 5
    while await rt.inspect(hk) is not RunState.EXITED:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)
    assert _exists(left)  # nobody removed it: its supervisor is dead
    # Another agent on this host (its own state dir): its tasks' cgroups share the parent.
    neighbour = ProcessRuntime(tmp_path / "neighbour", poll_s=0.05)
    theirs_spec = spec("exec sleep 30", memory_mb=64)
    theirs = await neighbour.start(theirs_spec)
    try:
        again = ProcessRuntime(tmp_path / "state", poll_s=0.05)  # the agent, restarted
        assert again.node_facts()["cgroups"] == rt.cgroups.mode
        assert not _exists(left) and _exists(kept)  # the running task's stays
        # ... and the neighbour's, which this agent knows nothing of, is neither removed
        # nor its task killed.
        assert _exists(Path(str(_cgroup(neighbour, theirs_spec)["memory"])))
        assert await neighbour.inspect(theirs) is RunState.RUNNING
    finally:
        await neighbour.remove(theirs)
        await neighbour.close()
    await rt.remove(hr)
    assert not _exists(kept)


async def test_a_start_whose_supervisor_never_ran_leaves_no_cgroup(
    rt: ProcessRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    def lost(request: object) -> str:
        raise OSError("the forker is gone")

    monkeypatch.setattr(rt._forker, "start_supervisor", lost)
    s = spec("true", memory_mb=64)
    with pytest.raises(RuntimeStartError, match="the forker is gone"):
        await rt.start(s)
    name = f"{s.task_id}-0-{rt._cgroup_suffix}"
    parents = [rt.cgroups.v2] if rt.cgroups.v2 is not None else list(rt.cgroups.v1.values())
    assert parents and [p / name for p in parents if _exists(p / name)] == []
