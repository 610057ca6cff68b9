"""The process runtime against real processes: exit codes, limits, signals, re-adoption."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from agent.runtimes.base import ErrorKind, Handle, RunSpec, RunState, Runtime, RuntimeStartError
from agent.runtimes.process import ProcessRuntime, looks_like_cpu_oom, read_tail
from tests.contract.runtime import RuntimeContract, shell_script, split_behaviour
from tests.wait import wait_until, wait_until_async

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


class TestProcessRuntime(RuntimeContract):
    has_images = False  # `image` is ignored: the command runs on the host
    term_stop_within_s = 2.0
    kill_slack_s = 2.5

    def make_runtime(self, tmp_path: Path) -> Runtime:
        return ProcessRuntime(tmp_path / "state", poll_s=0.05)

    def make_restarted(self, rt: Runtime) -> Runtime:
        assert isinstance(rt, ProcessRuntime)
        return ProcessRuntime(rt.tasks_dir.parent, poll_s=0.05)

    def spec(self, prints: Sequence[str] = (), **kw: Any) -> RunSpec:
        script, fields = split_behaviour(kw)
        return spec(shell_script(prints, **script), **fields)

    async def frozen(self, rt: Runtime, h: Handle) -> bool:
        """Nothing in the job's process group runs: each process is stopped, or waits
        without running (a shell in vfork, for its stopped child's exec), and one is stopped."""
        group = [p for p in psutil.process_iter() if _pgid(p.pid) == int(h.id)]
        states = {p.status() for p in group}
        idle = {psutil.STATUS_STOPPED, psutil.STATUS_DISK_SLEEP}
        return psutil.STATUS_STOPPED in states and states <= idle

    async def check_removed(self, rt: Runtime, s: RunSpec, h: Handle) -> None:
        assert isinstance(rt, ProcessRuntime)
        assert not (rt.tasks_dir / f"{s.task_id}-0").exists()
        assert not psutil.pid_exists(int(h.id)) or psutil.Process(int(h.id)).status() == "zombie"

    # -- the process runtime's own cases --------------------------------------------------

    async def test_a_start_that_never_reached_a_supervisor_is_started_once(
        self, rt: ProcessRuntime, tmp_path: Path
    ) -> None:
        """An agent killed after writing an attempt's state.json, while its forker held the
        request: no supervisor ran (none opened the log), so nothing ran. A restarted
        runtime holds nothing of it (readoption skips it, a record-less START is not
        answered as lost), and the START runs it, once."""
        s = spec("echo ran >> " + str(tmp_path / "runs"))
        d = rt.tasks_dir / f"{s.task_id}-{s.attempt}"
        d.mkdir(parents=True)
        (d / "state.json").write_text(json.dumps({"task_id": s.task_id, "attempt": s.attempt}))
        restarted = ProcessRuntime(rt.tasks_dir.parent, poll_s=0.05)
        handle = Handle(runtime="process", id="", task_id=s.task_id, attempt=s.attempt)
        assert await restarted.inspect(handle) is RunState.MISSING
        h = await restarted.start(s)
        report = await restarted.wait(h)
        assert report.exit_code == 0, report
        assert (tmp_path / "runs").read_text() == "ran\n"
        again = await restarted.start(s)  # redelivered once more: not run twice
        assert again.id == h.id and await restarted.inspect(again) is RunState.EXITED
        assert (tmp_path / "runs").read_text() == "ran\n"
        await restarted.close()

    async def test_stderr_keeps_its_place_beside_stdout(self, rt: ProcessRuntime) -> None:
        h = await rt.start(spec("echo hello; echo oops >&2"))
        report = await rt.wait(h)
        assert report.output_tail == ["hello", "oops"]  # one file: the order is kept
        assert await rt.logs(h) == ["hello", "oops"]

    async def test_an_allocation_failure_in_the_output_shows_as_oom(
        self, rt: ProcessRuntime
    ) -> None:
        # A limit the command sets itself (no cgroup involved): the evidence is the MemoryError.
        cmd = f"ulimit -v 300000; {sys.executable} -c 'x = bytearray(512 * 1024 * 1024)'"
        report = await rt.wait(await rt.start(spec(cmd, memory_mb=4096)))
        assert report.exit_code == 1
        assert report.oom_killed
        assert "MemoryError" in report.output_tail

    async def test_a_bare_sigkill_is_not_called_an_oom(self, rt: ProcessRuntime) -> None:
        report = await rt.wait(await rt.start(spec("kill -9 $$")))
        assert report.exit_code == 137 and not report.oom_killed

    async def test_environment_is_built_not_inherited(
        self, rt: ProcessRuntime, monkeypatch: pytest.MonkeyPatch
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

    async def test_no_address_space_limit_and_no_new_privileges(self, rt: ProcessRuntime) -> None:
        # memory_mb is a cgroup's memory limit (test_runtime_process_cgroups.py), never
        # RLIMIT_AS: runtimes reserve far more address space than they use.
        cmd = "ulimit -v; grep NoNewPrivs /proc/self/status"
        h = await rt.start(spec(cmd, memory_mb=256))
        await rt.wait(h)
        lines = await rt.logs(h)
        assert lines[0] == "unlimited"
        assert lines[1].split() == ["NoNewPrivs:", "1"]

    async def test_pause_stops_the_whole_process_group(self, rt: ProcessRuntime) -> None:
        h = await rt.start(spec("sleep 30 & wait"))
        job = psutil.Process(int(h.id))
        # The group's member must exist before the pause, or it is forked after the signal.
        await wait_until_async(lambda: bool(job.children()), 5, message="the shell's child started")
        await rt.pause(h)
        # SIGSTOP reaches each process of the group when it is next scheduled, not at once.
        await wait_until_async(
            lambda: (
                job.status() == psutil.STATUS_STOPPED
                and all(c.status() == psutil.STATUS_STOPPED for c in job.children())
            ),
            5,
            message="every process of the group stopped",
        )
        await rt.unpause(h)
        assert job.status() != psutil.STATUS_STOPPED
        await rt.stop(h, grace_s=2)

    async def test_leftover_children_go_with_the_main_process(self, rt: ProcessRuntime) -> None:
        h = await rt.start(spec("sleep 60 & echo $!"))
        await rt.wait(h)
        orphan = int((await rt.logs(h))[0])
        await wait_until_async(
            lambda: (
                not psutil.pid_exists(orphan)
                or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE
            ),
            3,
            message="the background child went with its task",
        )

    @pytest.mark.parametrize(
        ("overrides", "kind"),
        [
            ({"command": "  "}, ErrorKind.INVALID_CONFIG),
            (
                {"volumes": [{"host_path": "/tmp", "container_path": "/data"}]},
                ErrorKind.INVALID_CONFIG,
            ),
        ],
        ids=["no-command", "remapped-volume"],
    )
    async def test_invalid_specs(
        self, rt: ProcessRuntime, overrides: dict[str, object], kind: ErrorKind
    ) -> None:
        # (a missing volume: the contract's test_a_missing_volume_is_invalid_config)
        base = spec("true").model_dump()
        with pytest.raises(RuntimeStartError) as err:
            await rt.start(RunSpec.model_validate({**base, **overrides}))
        assert err.value.kind is kind

    async def test_a_volume_at_its_own_path_is_usable(
        self, rt: ProcessRuntime, tmp_path: Path
    ) -> None:
        data = tmp_path / "data"
        data.mkdir()
        (data / "in.txt").write_text("payload\n")
        s = spec(
            f"cat {data}/in.txt", volumes=[{"host_path": str(data), "container_path": str(data)}]
        )
        h = await rt.start(s)
        await rt.wait(h)
        assert await rt.logs(h) == ["payload"]


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
        exit_json = d / "exit.json"
        wait_until(exit_json.exists, 30, 0.02, "exit.json (else the supervisor gave up)")
    finally:
        forker.close()
    assert json.loads((d / "exit.json").read_text())["exit_code"] == 0
    assert (d / "output.log").read_text() == "ran\n"  # nothing else in the task's output


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
