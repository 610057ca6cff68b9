"""The process runtime's supervisor script and its command line, without running it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from agent.runtimes import process_supervisor


def test_the_supervisor_imports_nothing_costly() -> None:
    # Each import is CPU spent on every task (docs/benchmarks.md): json drags in re, signal
    # enum, subprocess a fork with preexec_fn. ctypes only on the fallback path, in the job.
    tree = ast.parse(process_supervisor.SCRIPT)
    top = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    nested = {
        a.name
        for f in tree.body
        if isinstance(f, ast.FunctionDef)
        for n in ast.walk(f)
        if isinstance(n, ast.Import)
        for a in n.names
    }
    assert top == {"posix", "sys", "time", "_signal"}
    assert nested == {"ctypes", "resource"}
    assert not any(isinstance(n, ast.ImportFrom) for n in ast.walk(tree))


def test_setpriv_lookup(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert process_supervisor.find_setpriv(True) is None  # missing: the prctl fallback
    assert process_supervisor.find_setpriv(False) is None
    assert process_supervisor.find_setpriv("/opt/setpriv") == "/opt/setpriv"
    argv = process_supervisor.command_line(
        Path("/s.py"), None, Path("/t"), address_space=0, uid=-1, gid=-1, shell="sh", command="x"
    )
    assert argv[:3] == [sys.executable, "-I", "-S"] and argv[-3:] == ["prctl", "sh", "x"]
