"""The process runtime against real processes: exit codes, limits, signals, re-adoption."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import psutil
import pytest

from agent.runtimes.base import (
    ErrorKind,
    Handle,
    HandleNotFound,
    InvalidOperation,
    RunSpec,
    RunState,
    RuntimeStartError,
)
from agent.runtimes.process import ProcessRuntime, looks_like_cpu_oom, read_tail

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="the process runtime is Linux-only"
    ),
]

REPO = Path(__file__).resolve().parents[2]


def spec(command: str, **kw: object) -> RunSpec:
    return RunSpec.model_validate(
        {
            "task_id": f"p{uuid.uuid4().hex[:10]}",
            "attempt": 0,
            "image": "none",
            "command": command,
            **kw,
        }
    )


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[ProcessRuntime]:
    runtime = ProcessRuntime(tmp_path / "state", poll_s=0.05)
    yield runtime
    for handle in await runtime.list_managed():  # never leave a process behind
        await runtime.remove(handle)


async def until(rt: ProcessRuntime, h: Handle, state: RunState, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while await rt.inspect(h) is not state:
        assert time.monotonic() < deadline, f"never reached {state}"
        await asyncio.sleep(0.02)


async def test_echo_exit_zero_and_logs_stay_readable(rt: ProcessRuntime) -> None:
    h = await rt.start(spec("echo hello; echo oops >&2"))
    report = await rt.wait(h)
    assert report.exit_code == 0 and report.succeeded and not report.oom_killed
    assert report.output_tail == ["hello", "oops"]
    assert await rt.inspect(h) is RunState.EXITED
    assert await rt.logs(h) == ["hello", "oops"]
    assert await rt.logs(h, tail=1) == ["oops"]
    assert await rt.logs(h, tail=0) == []


async def test_exit_code_is_captured(rt: ProcessRuntime) -> None:
    report = await rt.wait(await rt.start(spec("exit 3")))
    assert report.exit_code == 3 and not report.succeeded


async def test_an_allocation_failure_in_the_output_shows_as_oom(rt: ProcessRuntime) -> None:
    # A limit the command sets itself (no cgroup involved): the evidence is the MemoryError.
    cmd = f"ulimit -v 300000; {sys.executable} -c 'x = bytearray(512 * 1024 * 1024)'"
    report = await rt.wait(await rt.start(spec(cmd, memory_mb=4096)))
    assert report.exit_code == 1
    assert report.oom_killed
    assert "MemoryError" in report.output_tail


async def test_a_bare_sigkill_is_not_called_an_oom(rt: ProcessRuntime) -> None:
    report = await rt.wait(await rt.start(spec("kill -9 $$")))
    assert report.exit_code == 137 and not report.oom_killed


@pytest.mark.parametrize(
    ("code", "lines", "oom"),
    [
        (1, ["MemoryError"], True),
        (1, ["sh: Cannot allocate memory"], True),
        (134, ["terminate called after throwing an instance of 'std::bad_alloc'"], True),
        (1, ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"], False),
        (0, ["MemoryError"], False),
        (137, ["Killed"], False),
        (139, [], False),
    ],
)
def test_oom_evidence(code: int, lines: list[str], oom: bool) -> None:
    assert looks_like_cpu_oom(code, lines) is oom


async def test_environment_is_built_not_inherited(
    rt: ProcessRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_AGENT_SECRET", "do-not-leak")
    s = spec(
        'echo "A=$A"; echo "S=${HF_AGENT_SECRET:-}"; echo "H=$HOME"; '
        'echo "T=$HETEROFLOW_TASK_ID"; pwd; echo "C=${CUDA_VISIBLE_DEVICES:-}"',
        env={"A": "b c"},
        gpu_ids=("GPU-1",),
        gpu_vendor="nvidia",
    )
    h = await rt.start(s)
    await rt.wait(h)
    lines = await rt.logs(h)
    work = str(rt.tasks_dir / f"{s.task_id}-0" / "work")
    assert lines == ["A=b c", "S=", f"H={work}", f"T={s.task_id}", work, "C=GPU-1"]


async def test_no_address_space_limit_and_no_new_privileges(rt: ProcessRuntime) -> None:
    # memory_mb is a cgroup's memory limit (test_runtime_process_cgroups.py), never RLIMIT_AS:
    # runtimes reserve far more address space than they use.
    cmd = "ulimit -v; grep NoNewPrivs /proc/self/status"
    h = await rt.start(spec(cmd, memory_mb=256))
    await rt.wait(h)
    lines = await rt.logs(h)
    assert lines[0] == "unlimited"
    assert lines[1].split() == ["NoNewPrivs:", "1"]


async def _until(check: Callable[[], bool], what: str, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


async def test_pause_stops_the_process_group(rt: ProcessRuntime) -> None:
    h = await rt.start(spec("sleep 30 & wait"))
    job = psutil.Process(int(h.id))
    # The group's member must exist before the pause, or it is forked after the signal.
    await _until(lambda: bool(job.children()), "the shell's child started")
    await rt.pause(h)
    await rt.pause(h)  # idempotent
    assert await rt.inspect(h) is RunState.PAUSED
    # SIGSTOP reaches each process of the group when it is next scheduled, not at once.
    await _until(
        lambda: (
            job.status() == psutil.STATUS_STOPPED
            and all(c.status() == psutil.STATUS_STOPPED for c in job.children())
        ),
        "every process of the group stopped",
    )
    await rt.unpause(h)
    assert await rt.inspect(h) is RunState.RUNNING
    assert job.status() != psutil.STATUS_STOPPED
    await rt.stop(h, grace_s=2)
    with pytest.raises(InvalidOperation):
        await rt.pause(h)


async def test_stop_sends_sigterm_then_sigkill_after_grace(rt: ProcessRuntime) -> None:
    h = await rt.start(spec("sleep 30"))
    await until(rt, h, RunState.RUNNING)
    t0 = time.monotonic()
    await rt.stop(h, grace_s=5)
    assert time.monotonic() - t0 < 2
    assert (await rt.wait(h)).exit_code == 143

    stubborn = await rt.start(spec("trap '' TERM; echo ready; sleep 30"))
    deadline = time.monotonic() + 5
    while "ready" not in await rt.logs(stubborn):  # its trap is set once it says so
        assert time.monotonic() < deadline, "the stubborn task never got ready"
        await asyncio.sleep(0.02)
    t0 = time.monotonic()
    await rt.stop(stubborn, grace_s=0.5)
    assert 0.4 < time.monotonic() - t0 < 3
    assert (await rt.wait(stubborn)).exit_code == 137
    await rt.stop(stubborn)  # already ended: nothing to do


async def test_stop_of_a_paused_task(rt: ProcessRuntime) -> None:
    h = await rt.start(spec("sleep 30"))
    await rt.pause(h)
    await rt.stop(h, grace_s=5)
    assert (await rt.wait(h)).exit_code == 143


async def test_leftover_children_go_with_the_main_process(rt: ProcessRuntime) -> None:
    h = await rt.start(spec("sleep 60 & echo $!"))
    await rt.wait(h)
    orphan = int((await rt.logs(h))[0])
    deadline = time.monotonic() + 3
    while psutil.pid_exists(orphan) and psutil.Process(orphan).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the background child outlived its task"
        await asyncio.sleep(0.05)


async def test_follow_logs_yields_lines_as_they_come(rt: ProcessRuntime) -> None:
    h = await rt.start(spec("echo one; sleep 0.3; echo two; sleep 0.3; printf three"))
    seen: list[tuple[str, float]] = []
    t0 = time.monotonic()
    async for line in rt.follow_logs(h):
        seen.append((line, time.monotonic() - t0))
    assert [line for line, _ in seen] == ["one", "two", "three"]
    assert seen[-1][1] - seen[0][1] > 0.4  # streamed, not read at the end
    assert [line async for line in rt.follow_logs(h, tail=1)] == ["three"]


async def test_start_is_idempotent_and_remove_cleans_up(rt: ProcessRuntime) -> None:
    s = spec("sleep 30")
    h = await rt.start(s)
    assert await rt.start(s) == h
    await rt.remove(h)
    await rt.remove(h)  # idempotent
    assert await rt.inspect(h) is RunState.MISSING
    assert not (rt.tasks_dir / f"{s.task_id}-0").exists()
    assert not psutil.pid_exists(int(h.id)) or psutil.Process(int(h.id)).status() == "zombie"
    with pytest.raises(HandleNotFound):
        await rt.wait(h)


@pytest.mark.parametrize(
    ("overrides", "kind"),
    [
        ({"command": "  "}, ErrorKind.INVALID_CONFIG),
        ({"volumes": [{"host_path": "/tmp", "container_path": "/data"}]}, ErrorKind.INVALID_CONFIG),
        (
            {"volumes": [{"host_path": "/no/such/dir", "container_path": "/no/such/dir"}]},
            ErrorKind.INVALID_CONFIG,
        ),
    ],
    ids=["no-command", "remapped-volume", "missing-volume"],
)
async def test_invalid_specs(
    rt: ProcessRuntime, overrides: dict[str, object], kind: ErrorKind
) -> None:
    base = spec("true").model_dump()
    with pytest.raises(RuntimeStartError) as err:
        await rt.start(RunSpec.model_validate({**base, **overrides}))
    assert err.value.kind is kind


async def test_a_volume_at_its_own_path_is_usable(rt: ProcessRuntime, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("payload\n")
    s = spec(f"cat {data}/in.txt", volumes=[{"host_path": str(data), "container_path": str(data)}])
    h = await rt.start(s)
    await rt.wait(h)
    assert await rt.logs(h) == ["payload"]


async def test_missing_shell_is_a_start_error(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path, shell="/no/such/sh")
    with pytest.raises(RuntimeStartError) as err:
        await rt.start(spec("true"))
    assert err.value.kind is ErrorKind.INVALID_CONFIG
    assert await rt.list_managed() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
async def test_run_as_another_user() -> None:
    # The user must be able to traverse the state dir: pytest's tmp root is 0700, so not there.
    with tempfile.TemporaryDirectory(prefix="hf-run-as-") as state:
        os.chmod(state, 0o755)
        rt = ProcessRuntime(state, run_as="nobody")
        h = await rt.start(spec("id -u; touch $HOME/ok && echo writable; touch ../exit.json"))
        report = await rt.wait(h)
        lines = await rt.logs(h)
        assert lines[:2] == ["65534", "writable"]
        assert "Permission denied" in lines[2]  # it cannot forge its own exit record
        assert report.exit_code == 1


_AGENT = textwrap.dedent(
    """
    import asyncio, sys
    from agent.runtimes.base import RunSpec
    from agent.runtimes.process import ProcessRuntime

    async def main():
        rt = ProcessRuntime(sys.argv[1])
        spec = RunSpec(task_id=sys.argv[2], attempt=1, image="none", command=sys.argv[3])
        print((await rt.start(spec)).id)

    asyncio.run(main())
    """
)


def start_in_another_agent(state: Path, task_id: str, command: str) -> str:
    """Start a task from a separate agent process that then exits (an agent restart)."""
    out = subprocess.run(
        [sys.executable, "-c", _AGENT, str(state), task_id, command],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


async def test_readoption_after_an_agent_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    task_id = f"r{uuid.uuid4().hex[:8]}"
    pid = start_in_another_agent(state, task_id, "echo started; sleep 1.5; echo finishing; exit 7")
    rt = ProcessRuntime(state, poll_s=0.05)  # the restarted agent: not the job's parent
    try:
        [h] = await rt.list_managed()
        assert (h.task_id, h.attempt, h.id) == (task_id, 1, pid)
        assert await rt.inspect(h) is RunState.RUNNING
        report = await rt.wait(h)
        assert report.exit_code == 7  # survived the restart through exit.json
        assert report.output_tail == ["started", "finishing"]
    finally:
        for handle in await rt.list_managed():
            await rt.remove(handle)


async def test_readopted_task_can_be_paused_and_stopped(tmp_path: Path) -> None:
    state = tmp_path / "state"
    pid = start_in_another_agent(state, "adopted", "sleep 30")
    rt = ProcessRuntime(state, poll_s=0.05)
    try:
        [h] = await rt.list_managed()
        await rt.pause(h)
        assert psutil.Process(int(pid)).status() == psutil.STATUS_STOPPED
        await rt.unpause(h)
        await rt.stop(h, grace_s=3)
        assert (await rt.wait(h)).exit_code == 143
    finally:
        for handle in await rt.list_managed():
            await rt.remove(handle)


def test_read_tail(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(10000)))
    assert read_tail(path, 2, block=64) == ["line 9998", "line 9999"]
    assert read_tail(path, 0) == []
    assert read_tail(tmp_path / "missing", 5) == []
    assert len(read_tail(path, 20000)) == 10000


async def test_concurrent_starts_on_a_fresh_runtime_all_start(tmp_path: Path) -> None:
    # The agent applies commands concurrently: the first starts on a new node race to write
    # the supervisor script, and none may fail for it.
    for round_ in range(5):
        rt = ProcessRuntime(tmp_path / f"state{round_}", poll_s=0.05)
        handles = await asyncio.gather(*(rt.start(spec("true")) for _ in range(12)))
        reports = await asyncio.gather(*(rt.wait(h) for h in handles))
        assert [r.exit_code for r in reports] == [0] * 12


def test_a_supervisor_whose_agent_died_before_its_answer_still_records_the_exit(
    tmp_path: Path,
) -> None:
    """`up` SIGKILLed while starting a task: the supervisor's "ok" meets a pipe nobody reads.
    It must go on supervising and write exit.json, else the restarted agent reports an
    unknown exit, the task fails and its retry runs the command a second time."""
    from agent.runtimes.process_supervisor import Forker

    forker = Forker(tmp_path / "forker.pyc")
    d = tmp_path / "task"
    (d / "work").mkdir(parents=True)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the agent is gone before the supervisor answers
    request = {"dir": str(d), "cgroup": None, "uid": -1, "gid": -1, "shell": "/bin/sh"}
    try:
        forker.send(request | {"command": "echo ran", "env": {}}, write_end)
        os.close(write_end)
        deadline = time.monotonic() + 30
        while not (d / "exit.json").exists():
            assert time.monotonic() < deadline, "no exit.json: the supervisor gave up"
            time.sleep(0.02)
    finally:
        forker.close()
    assert json.loads((d / "exit.json").read_text())["exit_code"] == 0
    assert (d / "output.log").read_text() == "ran\n"  # nothing else in the task's output
