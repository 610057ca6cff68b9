"""The process runtime's per-task supervisor, seen from /proc: what the job's process gets
(group, session, no_new_privs, limits, user, fds, signal dispositions), the files it writes,
signal forwarding and its error replies, and the forker they are forked from."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from agent.runtimes.base import ErrorKind, Handle, RunSpec, RunState, RuntimeStartError
from agent.runtimes.process import ProcessRuntime
from tests.wait import wait_until_async

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="the process runtime is Linux-only"
    ),
]


def spec(command: str, **kw: object) -> RunSpec:
    return RunSpec.model_validate(
        {"task_id": f"s{uuid.uuid4().hex[:10]}", "attempt": 0, "image": "none", "command": command}
        | kw
    )


@pytest.fixture
async def runtimes() -> AsyncIterator[list[ProcessRuntime]]:
    made: list[ProcessRuntime] = []
    yield made
    for rt in made:  # never leave a process behind
        for handle in await rt.list_managed():
            await rt.remove(handle)


def _runtime(made: list[ProcessRuntime], state: Path, **kw: Any) -> ProcessRuntime:
    rt = ProcessRuntime(state, poll_s=0.05, **kw)
    made.append(rt)
    return rt


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def _pids(rt: ProcessRuntime, h: Handle) -> dict[str, int]:
    data: dict[str, int] = json.loads((rt.tasks_dir / f"{h.task_id}-0" / "pids.json").read_text())
    return data


def _environ(pid: int) -> bytes:
    return Path(f"/proc/{pid}/environ").read_bytes()


def _fds(pid: int) -> dict[str, str]:
    fds = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed between listing and reading
            fds[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
    return fds


def _cgroup_procs(cgroup: str) -> list[str]:
    return Path(cgroup, "cgroup.procs").read_text().split()


def _address_space_limit(pid: int) -> str:
    row = next(r for r in Path(f"/proc/{pid}/limits").read_text().splitlines() if "address" in r)
    return row.split()[3]  # "Max address space  <soft> <hard> bytes"


async def test_the_jobs_process(runtimes: list[ProcessRuntime], tmp_path: Path) -> None:
    rt = _runtime(runtimes, tmp_path / "state")
    h = await rt.start(spec("exec sleep 30", memory_mb=300))
    pid = int(h.id)
    pids = _pids(rt, h)
    sup = pids["supervisor_pid"]
    assert pids["pid"] == pid
    d = rt.tasks_dir / f"{h.task_id}-0"
    assert os.getpgid(pid) == pid  # a group of its own: signals to it never hit the supervisor
    assert os.getsid(pid) == sup == os.getsid(sup) != os.getsid(0)  # the supervisor's session
    assert _status(pid)["NoNewPrivs"] == "1"
    assert _address_space_limit(pid) == "unlimited"  # memory_mb is its cgroup's limit
    cgroup = json.loads((d / "state.json").read_text())["cgroup"]
    if rt.cgroups.mode != "none":  # in it (test_runtime_process_cgroups.py has the limits)
        assert cgroup["mode"] == rt.cgroups.mode
        procs = _cgroup_procs(cgroup["memory"])
        assert str(pid) in procs and str(sup) not in procs
    else:
        assert cgroup is None
    # Ignored signals survive exec: the job must not inherit Python's ignored SIGPIPE.
    assert int(_status(pid)["SigIgn"], 16) & (1 << (signal.SIGPIPE - 1)) == 0
    log = str(d / "output.log")
    # Nothing else leaks in. (Polled: while `sleep` is being loaded, ld.so has a file open.)
    await wait_until_async(
        lambda: _fds(pid) == {"0": "/dev/null", "1": log, "2": log}, 5, 0.02, lambda: _fds(pid)
    )
    assert os.readlink(f"/proc/{pid}/cwd") == str(d / "work")
    assert int(_status(pid)["Uid"].split()[0]) == os.geteuid()


async def test_exit_record_and_signal_forwarding(
    runtimes: list[ProcessRuntime], tmp_path: Path
) -> None:
    rt = _runtime(runtimes, tmp_path / "state")
    trapping = await rt.start(spec("trap 'exit 5' TERM; while :; do sleep 0.05; done"))
    plain = await rt.start(spec("sleep 30"))
    for h in (trapping, plain):
        # A signal to the supervisor (an operator's `kill`) goes on to the job's group.
        os.kill(_pids(rt, h)["supervisor_pid"], signal.SIGTERM)
    try:
        assert (await asyncio.wait_for(rt.wait(trapping), 10)).exit_code == 5
        assert (await asyncio.wait_for(rt.wait(plain), 10)).exit_code == 143
    except TimeoutError:
        for h in (trapping, plain):  # the supervisor died without passing the signal on
            os.killpg(int(h.id), signal.SIGKILL)
        raise
    t0 = time.time()
    for h, code, sig in ((trapping, 5, None), (plain, 143, signal.SIGTERM)):
        record = json.loads((rt.tasks_dir / f"{h.task_id}-0" / "exit.json").read_text())
        assert record.keys() == {"exit_code", "signal", "finished_at", "oom_kills"}
        assert (record["exit_code"], record["signal"], record["oom_kills"]) == (code, sig, 0)
        assert t0 - 10 < record["finished_at"] <= t0
    pids = _pids(rt, plain)
    assert set(pids) == {"pid", "pid_ticks", "supervisor_pid", "supervisor_ticks"}
    assert all(isinstance(v, int) and v > 0 for v in pids.values())


async def test_a_shell_that_cannot_run_is_refused_with_its_kind(
    runtimes: list[ProcessRuntime], tmp_path: Path
) -> None:
    not_executable = tmp_path / "sh"
    not_executable.write_text("#!/bin/sh\n")
    rt = _runtime(runtimes, tmp_path / "state", shell=str(not_executable))
    with pytest.raises(RuntimeStartError) as err:
        await rt.start(spec("true"))
    assert err.value.kind is ErrorKind.PERMISSION_DENIED
    assert "PermissionError" in str(err.value)
    assert await rt.list_managed() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
async def test_run_as_switches_user_group_and_drops_groups(runtimes: list[ProcessRuntime]) -> None:
    nobody = pwd.getpwnam("nobody")
    groups = os.getgroups()
    # The user must be able to traverse the state dir: pytest's tmp root is 0700, so not there.
    with tempfile.TemporaryDirectory(prefix="hf-run-as-") as state:
        os.chmod(state, 0o755)
        rt = _runtime(runtimes, Path(state), run_as="nobody")
        os.setgroups([4242])  # a supplementary group of the agent's, which must not pass on
        try:
            h = await rt.start(spec("id -u; id -g; id -G; grep NoNewPrivs /proc/self/status"))
        finally:
            os.setgroups(groups)
        assert (await rt.wait(h)).exit_code == 0
        assert await rt.logs(h) == [
            str(nobody.pw_uid),
            str(nobody.pw_gid),
            str(nobody.pw_gid),  # no supplementary group of the agent's is kept
            "NoNewPrivs:\t1",
        ]
        await rt.remove(h)


async def test_concurrent_starts_each_get_their_own_job(
    runtimes: list[ProcessRuntime], tmp_path: Path
) -> None:
    rt = _runtime(runtimes, tmp_path / "state")
    handles = await asyncio.gather(*(rt.start(spec("echo $HETEROFLOW_TASK_ID")) for _ in range(8)))
    reports = await asyncio.gather(*(rt.wait(h) for h in handles))
    assert [r.output_tail for r in reports] == [[h.task_id] for h in handles]


async def test_the_supervisor_holds_only_the_log_and_dev_null(
    runtimes: list[ProcessRuntime], tmp_path: Path
) -> None:
    # Forked from the forker, it must not keep the forker's socket (a supervisor holding it
    # would keep a dead agent's forker talking) nor the answer pipe after answering.
    rt = _runtime(runtimes, tmp_path / "state")
    h = await rt.start(spec("exec sleep 30"))
    sup = _pids(rt, h)["supervisor_pid"]
    log = str(rt.tasks_dir / f"{h.task_id}-0" / "output.log")
    await wait_until_async(
        lambda: _fds(sup) == {"0": "/dev/null", "2": log}, 5, 0.02, lambda: _fds(sup)
    )
    assert rt.forker_pid is not None
    assert _environ(rt.forker_pid) == b""  # no agent secrets
    assert _environ(sup) == b""
    assert _status(rt.forker_pid)["NoNewPrivs"] == "1"


async def test_ended_supervisors_are_reaped_at_once(
    runtimes: list[ProcessRuntime], tmp_path: Path
) -> None:
    rt = _runtime(runtimes, tmp_path / "state")
    handles = await asyncio.gather(*(rt.start(spec("true")) for _ in range(20)))
    for h in handles:
        assert (await asyncio.wait_for(rt.wait(h), 10)).exit_code == 0
    assert rt.forker_pid is not None
    forker = psutil.Process(rt.forker_pid)

    def zombies() -> list[int]:
        return [c.pid for c in forker.children() if c.status() == psutil.STATUS_ZOMBIE]

    await wait_until_async(
        lambda: not forker.children(), 1.0, 0.02, lambda: (forker.children(), zombies())
    )


async def test_a_dead_forker_is_started_again(
    runtimes: list[ProcessRuntime], tmp_path: Path
) -> None:
    rt = _runtime(runtimes, tmp_path / "state")
    first = await rt.start(spec("exec sleep 30"))
    assert rt.forker_pid is not None
    os.kill(rt.forker_pid, signal.SIGKILL)
    h = await rt.start(spec("echo again"))
    assert (await asyncio.wait_for(rt.wait(h), 10)).output_tail == ["again"]
    # The supervisor of the first task, in its own session, did not die with its forker.
    assert await rt.inspect(first) is RunState.RUNNING


async def test_the_job_outlives_the_agent_and_a_new_agent_takes_it_over(
    runtimes: list[ProcessRuntime], tmp_path: Path
) -> None:
    old = ProcessRuntime(tmp_path / "state", poll_s=0.05)  # closed below, like a stopped agent
    h = await old.start(spec("trap 'exit 7' TERM; while :; do sleep 0.05; done"))
    forker = old.forker_pid
    await old.close()
    assert forker is not None and not psutil.pid_exists(forker)
    new = _runtime(runtimes, tmp_path / "state")
    assert [x.task_id for x in await new.list_managed()] == [h.task_id]
    assert await new.inspect(h) is RunState.RUNNING
    await new.stop(h, grace_s=5)
    assert (await asyncio.wait_for(new.wait(h), 10)).exit_code == 7
