"""A runtime for hosts with no Docker engine: each attempt is a local `sh -c` process group.

Like Nomad's raw_exec, it isolates nothing; it only limits (a cgroup per task where the node
has one it can write, cgroups.py) and supervises. Each attempt lives in
`<state_dir>/tasks/<task_id>-<attempt>/`:

* `state.json`  who it is (task id, attempt) and its cgroup, written before anything runs;
* `pids.json`   the job's and its supervisor's pids with their kernel start times;
* `output.log`  stdout and stderr interleaved;
* `exit.json`   how the job ended, written by the supervisor;
* `work/`       the job's working directory and `$HOME`.

The job is started by a small supervisor in a session of its own, forked from one warm helper
per agent (process_supervisor.py), so it outlives an agent restart. The supervisor records the
exit status in `exit.json`, which is how a restarted agent, no longer the job's grandparent,
still learns the exit code. Linux only (it reads `/proc`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import pwd
import re
import shutil
import signal
import time
from collections.abc import AsyncGenerator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import structlog

from . import cgroups as cgroups_mod
from . import process_supervisor
from .base import (
    OUTPUT_TAIL_LINES,
    ErrorKind,
    ExitReport,
    Handle,
    HandleNotFound,
    InvalidOperation,
    LineAssembler,
    RunSpec,
    RunState,
    Runtime,
    RuntimeStartError,
    gpu_visibility_env,
    split_output,
    tail_lines,
)

log = structlog.get_logger(__name__)


# Clear evidence of a CPU-memory failure in the output; "CUDA out of memory" and friends are GPU
# OOM (a different retry path) and never count.
_OOM_TEXT = re.compile(
    r"MemoryError|Cannot allocate memory|std::bad_alloc|out of memory|memory exhausted",
    re.IGNORECASE,
)
_GPU_OOM_TEXT = re.compile(r"cuda|gpu|hip|cublas|cudnn|nccl|xpu", re.IGNORECASE)
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def looks_like_cpu_oom(exit_code: int | None, output: list[str]) -> bool:
    """True only with clear evidence: a failed exit and an allocation-failure message that is
    not about GPU memory. A bare SIGKILL or SIGSEGV is not evidence (see docs/runtimes.md)."""
    if not exit_code:
        return False
    return any(_OOM_TEXT.search(line) and not _GPU_OOM_TEXT.search(line) for line in output)


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a live pid, from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return fields[0], int(fields[19])


def _alive(pid: int | None, ticks: int | None) -> str | None:
    """State letter of the process if it is still the one we started (not a zombie)."""
    if not pid:
        return None
    stat = _proc_stat(pid)
    if stat is None or stat[1] != ticks or stat[0] in ("Z", "X"):
        return None
    return stat[0]


def _stopped(pid: int, state: str) -> bool:
    """Whether the job (the leader of its process group) is stopped. A shell that started a
    command with vfork waits for its child's exec in an uninterruptible sleep (D) that no
    signal stops; a SIGSTOP to the group that finds the child before its exec stops the child
    and leaves the shell waiting on it: stopped all the same (nothing in the group runs until
    a SIGCONT). Seen under heavy I/O, when the child's exec is slow to read its binary."""
    if state == "T":
        return True
    if state != "D":
        return False
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        return False
    return any((stat := _proc_stat(c)) is not None and stat[0] == "T" for c in children)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, obj: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def read_tail(path: Path, n: int, end: int | None = None, block: int = 65536) -> list[str]:
    """The last `n` lines of a file (of its first `end` bytes when given), reading backwards
    so a huge log costs little."""
    if n <= 0:
        return []
    try:
        with open(path, "rb") as f:
            pos = f.seek(0, os.SEEK_END) if end is None else end
            data = b""
            while pos > 0 and data.count(b"\n") <= n:
                step = min(block, pos)
                pos -= step
                f.seek(pos)
                data = f.read(step) + data
    except FileNotFoundError:
        return []
    return split_output(data)[-n:]


class ProcessRuntime(Runtime):
    name: ClassVar[str] = "process"

    def __init__(
        self,
        state_dir: Path | str,
        *,
        run_as: str | None = None,
        cgroups: str | cgroups_mod.Cgroups = "auto",
        cgroup_parent: str = "",
        pids_limit: int = 4096,
        shell: str = "/bin/sh",
        poll_s: float = 0.2,
    ) -> None:
        """`run_as`: a local user the job runs as (the agent must be root); None keeps the
        agent's user. `cgroups`: auto | v2 | v1 | none, how `memory_mb`, `cpu_cores` and
        `pids_limit` are enforced (cgroups.py; none: not at all), under `cgroup_parent`."""
        self.tasks_dir = Path(state_dir) / "tasks"
        self.run_as = run_as
        if isinstance(cgroups, str) and cgroups not in cgroups_mod.MODES:
            raise ValueError(f"cgroups: {cgroups!r} is not one of {', '.join(cgroups_mod.MODES)}")
        self._cgroups_wanted = cgroups
        self._cgroup_parent = cgroup_parent
        self._cgroups: cgroups_mod.Cgroups | None = None if isinstance(cgroups, str) else cgroups
        self.pids_limit = pids_limit
        # Task cgroups of every agent on the host share a parent: this runtime's are told
        # apart by a digest of its state directory.
        self._cgroup_suffix = hashlib.sha1(
            str(self.tasks_dir.resolve()).encode(), usedforsecurity=False
        ).hexdigest()[:8]
        self.shell = shell
        self.poll_s = poll_s
        self._forker = process_supervisor.Forker(self.tasks_dir.parent / "forker.pyc")
        self._starting: set[str] = set()  # attempt dirs whose supervisor has not answered yet

    # -- files ----------------------------------------------------------------------------

    def _dir(self, task_id: str, attempt: int) -> Path:
        return self.tasks_dir / f"{task_id}-{attempt}"

    def _handle_dir(self, handle: Handle) -> Path:
        return self._dir(handle.task_id, handle.attempt)

    @property
    def forker_pid(self) -> int | None:
        """The forker's pid while it runs (benchmarks read its CPU and its children's)."""
        return self._forker.pid

    @property
    def cgroups(self) -> cgroups_mod.Cgroups:
        """Where this node makes task cgroups, found on first use (blocking, quick)."""
        if self._cgroups is None:
            wanted = self._cgroups_wanted
            assert isinstance(wanted, str)
            self._cgroups = cgroups_mod.detect(wanted, self._cgroup_parent)
            log.info("process task limits", cgroups=self._cgroups.mode)
        return self._cgroups

    def node_facts(self) -> dict[str, Any]:
        self._sweep_cgroups()
        return {"cgroups": self.cgroups.mode}

    def _sweep_cgroups(self) -> None:
        """At start-up: remove this runtime's task cgroups whose attempt has ended or is gone
        (a supervisor killed before it could remove its own)."""
        cg = self.cgroups
        suffix = f"-{self._cgroup_suffix}"
        parents = [cg.v2] if cg.v2 is not None else list(cg.v1.values())
        swept = 0
        for parent in dict.fromkeys(parents):
            for child in parent.glob(f"*{suffix}"):
                d = self.tasks_dir / child.name.removesuffix(suffix)
                if d.name in self._starting or self._state(d) not in (
                    RunState.EXITED,
                    RunState.MISSING,
                ):
                    continue
                swept += cgroups_mod.remove([str(child)])
        if swept:
            log.info("left-over task cgroups removed", count=swept)

    def _state(self, d: Path) -> RunState:
        if not (d / "state.json").exists():
            return RunState.MISSING
        if (d / "exit.json").exists():
            return RunState.EXITED
        pids = _read_json(d / "pids.json")
        if pids is None:
            if d.name in self._starting:
                return RunState.CREATED
            if not (d / "output.log").exists():
                # No supervisor ever ran for it (its first act creates the log): the start
                # died before one did, with an agent killed while its forker held the
                # request. Nothing ran, so nothing is held: a START for it starts it.
                return RunState.MISSING
            return RunState.EXITED
        job = _alive(pids.get("pid"), pids.get("pid_ticks"))
        if job is not None:
            return RunState.PAUSED if _stopped(int(pids["pid"]), job) else RunState.RUNNING
        # The job is gone; the supervisor may be finishing (writing exit.json) — or dead.
        if _alive(pids.get("supervisor_pid"), pids.get("supervisor_ticks")):
            return RunState.RUNNING
        return RunState.EXITED

    def _signal(self, d: Path, sig: int) -> None:
        pids = _read_json(d / "pids.json") or {}
        if self._state(d) in (RunState.RUNNING, RunState.PAUSED) and pids.get("pid"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pids["pid"]), sig)

    def _existing(self, handle: Handle) -> Path:
        d = self._handle_dir(handle)
        if not (d / "state.json").exists():
            raise HandleNotFound(handle)
        return d

    # -- start ----------------------------------------------------------------------------

    def _check(self, spec: RunSpec) -> None:
        if not spec.command.strip():
            raise RuntimeStartError(ErrorKind.INVALID_CONFIG, "the process runtime needs a command")
        for v in spec.volumes:
            # No mount namespace here: a volume is usable only where it already is.
            if os.path.normpath(v.host_path) != os.path.normpath(v.container_path):
                raise RuntimeStartError(
                    ErrorKind.INVALID_CONFIG,
                    f"volume {v.host_path} → {v.container_path}: the process runtime cannot "
                    "remap paths (container_path must equal host_path)",
                )
            if not os.path.exists(v.host_path):
                raise RuntimeStartError(ErrorKind.INVALID_CONFIG, f"{v.host_path} does not exist")
            if v.read_only:
                log.warning("read_only is not enforced by the process runtime", path=v.host_path)

    def _env(self, spec: RunSpec, work: Path) -> dict[str, str]:
        # Built from scratch: the agent's own environment (bus credentials…) never leaks in.
        env = {
            "PATH": os.environ.get("PATH", _DEFAULT_PATH),
            "HOME": str(work),
            "TMPDIR": str(work),
            "LANG": "C.UTF-8",
        }
        env.update(spec.env)
        env.update(gpu_visibility_env(spec.gpu_vendor, spec.gpu_ids))
        env["HETEROFLOW_TASK_ID"] = spec.task_id
        env["HETEROFLOW_ATTEMPT"] = str(spec.attempt)
        return env

    def _user(self) -> tuple[int, int]:
        if self.run_as is None:
            return -1, -1
        try:
            pw = pwd.getpwnam(self.run_as)
        except KeyError as e:
            raise RuntimeStartError(ErrorKind.INVALID_CONFIG, f"no user {self.run_as}") from e
        return pw.pw_uid, pw.pw_gid

    def _remove_cgroup(self, d: Path) -> None:
        cgroup = (_read_json(d / "state.json") or {}).get("cgroup")
        if isinstance(cgroup, dict) and not cgroups_mod.remove(list(cgroup.get("dirs") or [])):
            log.warning("a task's cgroup could not be removed", dirs=cgroup.get("dirs"))

    def _spawn(self, spec: RunSpec, d: Path) -> str:
        """Start the attempt's supervisor; its answer line."""
        uid, gid = self._user()
        work = d / "work"
        work.mkdir(parents=True, exist_ok=True)
        if uid >= 0:
            os.chown(work, uid, gid)
        cgroup = self.cgroups.make(
            f"{d.name}-{self._cgroup_suffix}",
            memory_mb=spec.memory_mb,
            cpu_cores=spec.cpu_cores,
            pids=self.pids_limit,
        )
        try:
            _write_json(
                d / "state.json",
                {
                    "task_id": spec.task_id,
                    "attempt": spec.attempt,
                    "image": spec.image,
                    "memory_mb": spec.memory_mb,
                    "cgroup": cgroup,
                    "started_at": time.time(),
                },
            )
        except OSError:
            cgroups_mod.remove(cgroup["dirs"] if cgroup else [])
            raise
        request = {
            "dir": str(d),
            "cgroup": cgroup,
            "uid": uid,
            "gid": gid,
            "shell": process_supervisor.resolve_shell(self.shell),
            "command": spec.command,
            "env": self._env(spec, work),
        }
        answer = self._forker.start_supervisor(request)
        if not answer and not (d / "output.log").exists():
            # No supervisor ever ran for it (its first act creates the log): the request died
            # with a forker that was killed holding it. Nothing started, so ask again.
            log.warning("start request lost with the forker; sending it again", attempt_dir=d.name)
            self._forker.settle()
            answer = self._forker.start_supervisor(request)
        return answer

    def _start_sync(self, spec: RunSpec) -> Handle:
        self._check(spec)
        d = self._dir(spec.task_id, spec.attempt)
        handle = Handle(runtime=self.name, id="", task_id=spec.task_id, attempt=spec.attempt)
        if (d / "state.json").exists():
            if self._state(d) is not RunState.MISSING:
                # Idempotency guard: a redelivered start of the same attempt must not run it
                # twice.
                pids = _read_json(d / "pids.json") or {}
                log.info("process already exists", task_id=spec.task_id, attempt=spec.attempt)
                return handle.model_copy(update={"id": str(pids.get("pid", ""))})
            # A start that never reached a supervisor (`_state`): cleared, and started now.
            log.info("process never started", task_id=spec.task_id, attempt=spec.attempt)
            self._remove_cgroup(d)
            shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True, exist_ok=True)
        self._starting.add(d.name)
        try:
            reply = self._spawn(spec, d).split(maxsplit=2)
        except OSError as e:
            self._remove_cgroup(d)  # made before the supervisor was asked for
            shutil.rmtree(d, ignore_errors=True)
            raise RuntimeStartError(ErrorKind.CONTAINER_RUNTIME_ERROR, str(e)) from e
        finally:
            self._starting.discard(d.name)
        if not reply or reply[0] != "ok":
            self._remove_cgroup(d)
            if len(reply) > 2 and reply[1] in {k.value for k in ErrorKind}:
                kind, msg = ErrorKind(reply[1]), reply[2].strip()
            else:  # the supervisor itself failed: its traceback is in the log
                kind = ErrorKind.CONTAINER_RUNTIME_ERROR
                msg = "supervisor failed: " + " | ".join(read_tail(d / "output.log", 5))
            shutil.rmtree(d, ignore_errors=True)
            raise RuntimeStartError(kind, msg)
        log.info("process started", task_id=spec.task_id, attempt=spec.attempt, pid=reply[1])
        return handle.model_copy(update={"id": reply[1]})

    async def start(self, spec: RunSpec) -> Handle:
        return await asyncio.to_thread(self._start_sync, spec)

    # -- wait and report ------------------------------------------------------------------

    def _report(self, d: Path) -> ExitReport:
        tail = read_tail(d / "output.log", OUTPUT_TAIL_LINES)
        result = _read_json(d / "exit.json")
        if result is None:
            return ExitReport(
                exit_code=None,
                error=f"{ErrorKind.CONTAINER_RUNTIME_ERROR.value}: the task's supervisor died "
                "without recording an exit status",
                output_tail=tail,
            )
        code = int(result["exit_code"])
        self._remove_cgroup(d)  # the supervisor removed it; this is for one that could not
        # Like a container's OOMKilled: the kernel killed something in the task's cgroup for
        # memory, and the task failed.
        oom = bool(code) and int(result.get("oom_kills") or 0) > 0
        return ExitReport(
            exit_code=code,
            oom_killed=oom or looks_like_cpu_oom(code, tail),
            output_tail=tail,
            finished_at=datetime.fromtimestamp(float(result["finished_at"]), UTC),
        )

    async def _until(self, d: Path, timeout_s: float | None) -> bool:
        """Poll until the attempt has ended; False when `timeout_s` passed first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._state(d) not in (RunState.EXITED, RunState.MISSING):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            await asyncio.sleep(self.poll_s)
        return True

    async def wait(self, handle: Handle) -> ExitReport:
        d = self._existing(handle)
        await self._until(d, None)
        if self._state(d) is RunState.MISSING:
            raise HandleNotFound(handle)
        return await asyncio.to_thread(self._report, d)

    # -- control --------------------------------------------------------------------------

    async def stop(self, handle: Handle, grace_s: float = 10.0) -> None:
        d = self._existing(handle)
        if self._state(d) in (RunState.EXITED, RunState.MISSING):
            return
        self._signal(d, signal.SIGTERM)
        self._signal(d, signal.SIGCONT)  # a paused job must wake up to receive the SIGTERM
        if not await self._until(d, grace_s):
            self._signal(d, signal.SIGKILL)
            await self._until(d, 10.0)
        log.info("process stopped", task_id=handle.task_id, attempt=handle.attempt)

    async def _set_paused(self, handle: Handle, paused: bool) -> None:
        d = self._existing(handle)
        target = RunState.PAUSED if paused else RunState.RUNNING
        state = self._state(d)
        if state is target:
            return
        if state not in (RunState.RUNNING, RunState.PAUSED):
            raise InvalidOperation(f"cannot {'pause' if paused else 'unpause'} a {state} task")
        self._signal(d, signal.SIGSTOP if paused else signal.SIGCONT)
        for _ in range(100):  # the kernel applies the stop asynchronously; wait to see it
            if self._state(d) in (target, RunState.EXITED):
                return
            await asyncio.sleep(0.01)

    async def pause(self, handle: Handle) -> None:
        await self._set_paused(handle, True)

    async def unpause(self, handle: Handle) -> None:
        await self._set_paused(handle, False)

    async def remove(self, handle: Handle) -> None:
        d = self._handle_dir(handle)
        if not d.exists():
            return
        if self._state(d) in (RunState.RUNNING, RunState.PAUSED):
            await self.stop(handle, grace_s=0)
        await asyncio.to_thread(self._remove_dir, d)

    def _remove_dir(self, d: Path) -> None:
        """The attempt's cgroup, then its directory (one thread hand-off for both)."""
        self._remove_cgroup(d)
        shutil.rmtree(d, True)

    # -- observe --------------------------------------------------------------------------

    async def logs(self, handle: Handle, tail: int | None = None) -> list[str]:
        path = self._existing(handle) / "output.log"
        if tail is None:
            data = await asyncio.to_thread(path.read_bytes) if path.exists() else b""
            return split_output(data)
        return tail_lines(await asyncio.to_thread(read_tail, path, tail), tail)

    async def follow_logs(
        self, handle: Handle, tail: int | None = None
    ) -> AsyncGenerator[str, None]:
        d = self._existing(handle)
        path = d / "output.log"
        with open(path, "rb") as f:  # noqa: ASYNC230 - a local file; each read is short
            if tail is not None:
                # The tail up to the current end, then everything from that very offset on.
                end = f.seek(0, os.SEEK_END)
                for line in read_tail(path, tail, end=end):
                    yield line
            lines = LineAssembler()
            while True:
                ended = self._state(d) in (RunState.EXITED, RunState.MISSING)
                chunk = f.read(65536)
                for line in lines.feed(chunk):
                    yield line
                if not chunk:
                    if ended:  # read once more after seeing the end: nothing is lost
                        break
                    await asyncio.sleep(self.poll_s)
            for line in lines.flush():
                yield line

    async def inspect(self, handle: Handle) -> RunState:
        return self._state(self._handle_dir(handle))

    async def close(self) -> None:
        """Stop the forker; the supervisors, in sessions of their own, carry on."""
        await asyncio.to_thread(self._forker.close)

    async def list_managed(self) -> list[Handle]:
        handles = []
        for state_file in sorted(self.tasks_dir.glob("*/state.json")):
            info = _read_json(state_file)
            if info is None or "task_id" not in info:
                continue
            pids = _read_json(state_file.parent / "pids.json") or {}
            handles.append(
                Handle(
                    runtime=self.name,
                    id=str(pids.get("pid", "")),
                    task_id=str(info["task_id"]),
                    attempt=int(info["attempt"]),
                )
            )
        return handles
