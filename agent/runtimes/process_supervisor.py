"""The process runtime's supervisors, forked from one warm helper per agent (the *forker*).

Every task runs under a supervisor: a process in a session of its own that starts the job in
its own process group, answers "ok <pid>" (or "ERR <kind> <message>"), forwards the signals
it receives, writes pids.json and, when the job ends, exit.json. A restarted agent reads those
files, so the job outlives the agent.

Starting a Python interpreter per task cost ~7 ms of CPU at best, most of what a trivial task
cost the node beyond the agent's own loop (docs/benchmarks.md, "Where HeteroFlow's CPU per job
goes"; `python -m bench.supervisor_cpu` measures it). So the interpreter starts once: the
agent starts the forker (`python -I -S forker.pyc <fd>`), sets no_new_privs on it once, and
sends it one request per task over a private socket pair; the forker forks, and the child
becomes that task's supervisor, already initialised. The forker reaps the supervisors as they
end (SIGCHLD), so none outlives its task as a zombie; it exits when the agent's end of the
socket closes (the agent stopped or died), and the supervisors, in sessions of their own,
carry on.

A request is an 8-byte length and a JSON object, the first byte carrying the write end of a
pipe (SCM_RIGHTS) that becomes the supervisor's stdout: the agent reads the answer from its
read end, and EOF without an answer means the supervisor died before it could give one.
"""

from __future__ import annotations

import importlib.util
import json
import marshal
import os
import shutil
import socket
import subprocess
import sys
import threading
from functools import cache
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

# The forker, written compiled to `<state_dir>/forker.pyc`. argv: the fd of its end of the
# socket pair. Its imports are paid once; what a supervisor does after the fork is only
# system calls and a little formatting.
# The job's side of the second fork does what subprocess would: its own group, stdin from
# /dev/null, stdout to the log (stderr already is), cwd, the signals Python ignores or
# handles back to default (ignored signals survive exec), its cgroup (cgroups.py: the agent
# made it and wrote its limits), user, no other fds; an error before exec goes back through a
# close-on-exec pipe, so EOF on it means exec worked. When the job ends the supervisor counts
# the cgroup's OOM kills into exit.json, kills what is left in it and removes it.
SCRIPT = r"""
import ctypes, gc, json, os, signal, socket, sys, time

MAXFD = 1 << 20

def no_new_privs():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0):  # PR_SET_NO_NEW_PRIVS, inherited by everything forked
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")

def ticks(pid):
    fd = os.open("/proc/%d/stat" % pid, os.O_RDONLY)
    try:
        return int(os.read(fd, 4096).rsplit(b")", 1)[1].split()[19])
    finally:
        os.close(fd)

def put(d, name, text):
    tmp = d + "/" + name + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, d + "/" + name)

def job(req, errpipe):
    os.setpgid(0, 0)
    os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
    os.dup2(2, 1)
    os.chdir(req["dir"] + "/work")
    for s in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
    cg = req.get("cgroup")
    for d in cg["dirs"] if cg else ():
        fd = os.open(d + "/cgroup.procs", os.O_WRONLY)
        try:
            os.write(fd, b"%d" % os.getpid())
        finally:
            os.close(fd)
    if req["uid"] >= 0:
        os.setgroups([]); os.setgid(req["gid"]); os.setuid(req["uid"])
    os.closerange(3, errpipe)
    os.closerange(errpipe + 1, MAXFD)
    shell = req["shell"]
    os.execve(shell, [shell, "-c", req["command"]], req["env"])

def read(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536).decode()
    finally:
        os.close(fd)

def oom_kills(cg, rc):
    # v2: memory.events; v1: memory.oom_control (kernels since 4.13 count oom_kill there).
    try:
        text = read(cg["memory"] + ("/memory.events" if cg["mode"] == "v2" else
                                    "/memory.oom_control"))
    except OSError:
        return 0
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    if cg["mode"] == "v1" and rc == -9:  # an older kernel: the limit was hit, the job killed
        try:
            return 1 if int(read(cg["memory"] + "/memory.failcnt")) else 0
        except (OSError, ValueError):
            return 0
    return 0

def clear(cg):
    # Right after the job is reaped the kernel may still count it in its cgroup (EBUSY):
    # retry soon first, then less often.
    deadline = time.monotonic() + 5
    pause = 0.0002
    for d in cg["dirs"] if cg else ():
        while True:
            try:
                pids = read(d + "/cgroup.procs").split()
            except OSError:
                break  # already gone
            for p in pids:
                try: os.kill(int(p), signal.SIGKILL)
                except OSError: pass
            try:
                os.rmdir(d)
                break
            except OSError:
                if time.monotonic() > deadline:
                    break  # the agent's remove tries again
                time.sleep(pause)
                pause = min(pause * 2, 0.02)

def supervise(req, reply):
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its own job is waited for below
    os.setsid()
    d = req["dir"]
    log = os.open(d + "/output.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
    os.dup2(reply, 1)
    os.dup2(log, 2)
    os.closerange(3, MAXFD)  # the forker's socket, the log's and reply's first fds
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            job(req, w)
        except BaseException as e:
            kind = ("PermissionDenied" if isinstance(e, PermissionError) else
                    "InvalidConfig" if isinstance(e, FileNotFoundError) else
                    "ContainerRuntimeError")
            os.write(w, ("%s %s: %s" % (kind, type(e).__name__, e)).encode(errors="replace"))
        finally:
            os._exit(127)
    try: os.setpgid(pid, pid)  # the job's group exists before a signal is forwarded to it
    except OSError: pass  # the job has done it itself, or has exec'd already
    def forward(sig, _frame):
        try: os.killpg(pid, sig)
        except ProcessLookupError: pass
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, forward)
    os.close(w)
    err = os.read(r, 65536)
    os.close(r)
    if err:
        os.waitpid(pid, 0)
        clear(req.get("cgroup"))
        os.write(1, b"ERR " + err.replace(b"\n", b" ") + b"\n")
        os._exit(127)
    me = os.getpid()
    put(d, "pids.json", '{"pid": %d, "pid_ticks": %d, "supervisor_pid": %d, '
        '"supervisor_ticks": %d}' % (pid, ticks(pid), me, ticks(me)))
    try:
        os.write(1, b"ok %d\n" % pid)
    except OSError:  # the agent died before reading it (a SIGKILLed `up`): supervise all the same
        pass
    os.close(1)
    rc = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    try: os.killpg(pid, signal.SIGKILL)  # like a container: the rest of the group goes too
    except ProcessLookupError: pass
    code = rc if rc >= 0 else 128 - rc
    cg = req.get("cgroup")
    ooms = oom_kills(cg, rc) if cg else 0
    clear(cg)
    put(d, "exit.json", '{"exit_code": %d, "signal": %s, "finished_at": %.6f, "oom_kills": %d}'
        % (code, -rc if rc < 0 else "null", time.time(), ooms))
    os._exit(code)

def reap(_sig=None, _frame=None):
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return

def recv_exactly(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data

def serve(sock):
    while True:
        head, fds, _flags, _addr = socket.recv_fds(sock, 8, 1)
        if not head:
            return  # the agent's end closed: it stopped or died
        rest = recv_exactly(sock, 8 - len(head))
        body = rest is not None and recv_exactly(sock, int.from_bytes(head + rest, "big"))
        if not body or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            return  # a broken stream cannot be resynchronised
        reply = fds[0]
        try:
            req = json.loads(body)
            pid = os.fork()
        except Exception as e:
            try: os.write(reply, ("ERR ContainerRuntimeError %s: %s\n" % (type(e).__name__, e))
                          .encode(errors="replace"))
            except OSError: pass
            os.close(reply)
            continue
        if pid == 0:
            try:
                supervise(req, reply)
            finally:
                os._exit(127)
        os.close(reply)

no_new_privs()
signal.signal(signal.SIGINT, signal.SIG_IGN)  # the agent's ^C stops it through the socket
signal.signal(signal.SIGCHLD, reap)
gc.freeze()  # fewer pages copied into each supervisor
serve(socket.socket(fileno=int(sys.argv[1])))
reap()
"""


@cache
def compiled() -> bytes:
    """SCRIPT as an unchecked hash-based .pyc (PEP 552) for this interpreter: run directly,
    the header's magic number is checked and the rest of it skipped."""
    code = compile(SCRIPT, "forker.py", "exec")
    source_hash = importlib.util.source_hash(SCRIPT.encode())
    flags = (1).to_bytes(4, "little")  # hash-based, unchecked
    return importlib.util.MAGIC_NUMBER + flags + source_hash + marshal.dumps(code)


def resolve_shell(shell: str) -> str:
    """The shell as a path (the supervisor execs it without a PATH search); one that cannot
    be found stays as given, and the exec's error says why."""
    if "/" in shell:
        return shell
    return shutil.which(shell) or shell


def write_script(path: Path) -> None:
    """The compiled forker at `path`, replaced atomically when it differs."""
    code = compiled()
    if path.exists() and path.read_bytes() == code:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(code)
    os.replace(tmp, path)


class Forker:
    """The agent's side of the forker: started on first use, started again if it died.

    `start_supervisor` is called from worker threads (starts run concurrently); a lock keeps
    each request's bytes together on the stream. The answer is read outside the lock."""

    def __init__(self, script: Path) -> None:
        self.script = script
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _spawn(self) -> socket.socket:
        self._shut()
        write_script(self.script)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(self.script), str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                env={},  # the agent's environment (bus credentials…) stays with the agent
                start_new_session=True,  # signals to the agent's group do not reach it
            )
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        self._sock = ours
        log.debug("forker started", pid=self._proc.pid)
        return ours

    def _shut(self) -> None:
        if self._sock is not None:
            self._sock.close()  # EOF: the forker leaves its loop and exits
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def send(self, request: dict[str, Any], reply_fd: int) -> None:
        """Hand one request to the forker; its supervisor answers on `reply_fd` (a copy of
        which goes to it: the caller closes its own)."""
        body = json.dumps(request).encode()
        with self._lock:
            for attempt in (1, 2):
                sock = self._sock
                if sock is None or self._proc is None or self._proc.poll() is not None:
                    if self._proc is not None:
                        log.warning("forker gone, starting it again", rc=self._proc.poll())
                    sock = self._spawn()
                try:
                    socket.send_fds(sock, [len(body).to_bytes(8, "big")], [reply_fd])
                    sock.sendall(body)
                    return
                except OSError:
                    if attempt == 2:
                        raise
                    self._shut()  # the forker died since: once more with a new one

    def start_supervisor(self, request: dict[str, Any]) -> str:
        """Send one task's request; the supervisor's answer line ("" if it died first)."""
        read_end, write_end = os.pipe()
        try:
            try:
                self.send(request, write_end)
            finally:
                os.close(write_end)  # the supervisor holds the only other copy
            with os.fdopen(read_end, "rb") as answer:
                read_end = -1
                return answer.readline().decode(errors="replace")
        finally:
            if read_end >= 0:
                os.close(read_end)

    def settle(self, within_s: float = 2.0) -> None:
        """After a request got no answer: if the forker is dying (it was killed with the
        request in its socket), wait for its end so the next request starts a new one."""
        with self._lock:
            if self._proc is None:
                return
            try:
                self._proc.wait(timeout=within_s)
            except subprocess.TimeoutExpired:
                return  # alive: the supervisor itself died
            self._shut()

    def close(self) -> None:
        with self._lock:
            self._shut()
