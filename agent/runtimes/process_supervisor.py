"""The process runtime's per-task supervisor: its source, its compiled form, its command line.

The supervisor runs once per task, so its start-up is most of the CPU a trivial task costs
the node beyond the agent's own loop (docs/benchmarks.md, "Where HeteroFlow's CPU per job
goes"; `python -m bench.supervisor_cpu` measures it). What it does not spend, measured:

* no `json` (it pulls in `re`), `subprocess` (a `preexec_fn` makes it fork, not vfork),
  `signal` (`enum`, `functools`) or `ctypes`: the job is started with `fork` + `execv`, the
  two JSON files hold integers and one float and are formatted by hand;
* not even `os` (with `-S` nothing has imported it yet; its Python layer costs ~1.5–2 ms): the
  built-in `posix` and `_signal` do everything it needs;
* no compiling: the agent writes the script compiled (`supervisor.pyc`, which the
  interpreter runs as is), ~1.2 ms less than compiling the source on every start;
* `PR_SET_NO_NEW_PRIVS` from util-linux `setpriv --no-new-privs` run in front of the
  interpreter (~1.3 ms): the flag is inherited by the supervisor and by everything it starts,
  and prevents no `setuid()` of its own. Without `setpriv` the job's side of the fork sets it
  through `ctypes`, imported only there (~5 ms more).
"""

from __future__ import annotations

import importlib.util
import marshal
import shutil
import sys
from functools import cache
from pathlib import Path

# The supervisor, written compiled to `<state_dir>/supervisor.pyc`. argv: task_dir,
# address-space limit (bytes, 0 = none), uid, gid (-1 = keep), "prctl" when it must set
# no_new_privs itself (else ""), shell (a path), command. It starts the job in its own process
# group (so signals aimed at the job never hit the supervisor), answers "ok <pid>" or
# "ERR <kind> <message>" on stdout, forwards the signals it receives itself, writes pids.json
# and, when the job ends, exit.json. Runs with `-I -S`.
# The job's side of the fork does what subprocess did for it: its own group, stdin from
# /dev/null, stdout to the log (stderr already is), cwd, SIGPIPE and SIGXFSZ back to default
# (Python ignores them, and ignored signals survive exec), limits, user, no other fds; an
# error before exec goes back through a close-on-exec pipe, so EOF on it means the exec worked.

SCRIPT = r"""
import posix, sys, time
import _signal
d, mem, uid, gid, nnp, shell, cmd = sys.argv[1:8]
mem, uid, gid = int(mem), int(uid), int(gid)
def ticks(pid):
    fd = posix.open("/proc/%d/stat" % pid, posix.O_RDONLY)
    try:
        return int(posix.read(fd, 4096).rsplit(b")", 1)[1].split()[19])
    finally:
        posix.close(fd)
def put(name, text):
    tmp = d + "/" + name + ".tmp"
    fd = posix.open(tmp, posix.O_WRONLY | posix.O_CREAT | posix.O_TRUNC, 0o666)
    try:
        posix.write(fd, text.encode())
    finally:
        posix.close(fd)
    posix.replace(tmp, d + "/" + name)
def job(errpipe):
    posix.setpgid(0, 0)
    posix.dup2(posix.open("/dev/null", posix.O_RDONLY), 0)
    posix.dup2(2, 1)
    posix.chdir(d + "/work")
    for s in (_signal.SIGPIPE, _signal.SIGXFSZ):
        _signal.signal(s, _signal.SIG_DFL)
    if nnp == "prctl":
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(38, 1, 0, 0, 0):  # PR_SET_NO_NEW_PRIVS
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if mem > 0:
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    if uid >= 0:
        posix.setgroups([]); posix.setgid(gid); posix.setuid(uid)
    posix.closerange(3, errpipe)
    posix.closerange(errpipe + 1, 1 << 20)
    posix.execv(shell, [shell, "-c", cmd])
r, w = posix.pipe()
pid = posix.fork()
if pid == 0:
    try:
        job(w)
    except BaseException as e:
        kind = ("PermissionDenied" if isinstance(e, PermissionError) else
                "InvalidConfig" if isinstance(e, FileNotFoundError) else "ContainerRuntimeError")
        posix.write(w, ("%s %s: %s" % (kind, type(e).__name__, e)).encode(errors="replace"))
    finally:
        posix._exit(127)
try: posix.setpgid(pid, pid)  # the job's group exists before a signal is forwarded to it
except OSError: pass  # the job has done it itself, or has exec'd already
def forward(sig, _frame):
    try: posix.killpg(pid, sig)
    except ProcessLookupError: pass
for s in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
    _signal.signal(s, forward)
posix.close(w)
err = posix.read(r, 65536)
posix.close(r)
if err:
    posix.waitpid(pid, 0)
    posix.write(1, b"ERR " + err.replace(b"\n", b" ") + b"\n")
    posix._exit(127)
me = posix.getpid()
put("pids.json", '{"pid": %d, "pid_ticks": %d, "supervisor_pid": %d, "supervisor_ticks": %d}'
    % (pid, ticks(pid), me, ticks(me)))
try:
    posix.write(1, b"ok %d\n" % pid)
except OSError:  # the agent died before reading it (a SIGKILLed `up`): supervise all the same
    pass
posix.close(1)
rc = posix.waitstatus_to_exitcode(posix.waitpid(pid, 0)[1])
try: posix.killpg(pid, _signal.SIGKILL)  # like a container: the rest of the group goes too
except ProcessLookupError: pass
code = rc if rc >= 0 else 128 - rc
put("exit.json", '{"exit_code": %d, "signal": %s, "finished_at": %.6f}'
    % (code, -rc if rc < 0 else "null", time.time()))
posix._exit(code)
"""


@cache
def compiled() -> bytes:
    """SCRIPT as an unchecked hash-based .pyc (PEP 552) for this interpreter: run directly,
    the header's magic number is checked and the rest of it skipped."""
    code = compile(SCRIPT, "supervisor.py", "exec")
    source_hash = importlib.util.source_hash(SCRIPT.encode())
    flags = (1).to_bytes(4, "little")  # hash-based, unchecked
    return importlib.util.MAGIC_NUMBER + flags + source_hash + marshal.dumps(code)


def resolve_shell(shell: str) -> str:
    """The shell as a path (the supervisor execs it without a PATH search); one that cannot
    be found stays as given, and the exec's error says why."""
    if "/" in shell:
        return shell
    return shutil.which(shell) or shell


def find_setpriv(setpriv: str | bool) -> str | None:
    """The `setpriv` to run in front of the supervisor: True looks it up on PATH, False never
    uses one (the job sets no_new_privs itself), a path is used as given."""
    if setpriv is True:
        return shutil.which("setpriv")
    return setpriv or None


def command_line(
    script: Path,
    setpriv: str | None,
    task_dir: Path,
    *,
    address_space: int,
    uid: int,
    gid: int,
    shell: str,
    command: str,
) -> list[str]:
    """argv of one supervisor, run with the agent's interpreter in isolated mode."""
    front = [setpriv, "--no-new-privs"] if setpriv else []
    nnp = "" if setpriv else "prctl"
    return [
        *front,
        *(sys.executable, "-I", "-S", str(script), str(task_dir), str(address_space)),
        *(str(uid), str(gid), nnp, shell, command),
    ]
