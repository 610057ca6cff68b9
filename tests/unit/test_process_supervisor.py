"""The process runtime's forker script, without running it."""

from __future__ import annotations

import ast
import importlib.util

from agent.runtimes import process_supervisor


def test_the_forker_imports_only_at_its_start() -> None:
    # Imports are paid once, when the forker starts; an import inside a function would be
    # paid again in every supervisor (docs/benchmarks.md, "Where HeteroFlow's CPU per job goes").
    tree = ast.parse(process_supervisor.SCRIPT)
    assert all(
        not isinstance(n, ast.Import | ast.ImportFrom)
        for f in tree.body
        if isinstance(f, ast.FunctionDef)
        for n in ast.walk(f)
    )
    top = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    assert top == {"ctypes", "gc", "json", "os", "signal", "socket", "sys", "time"}


def test_the_compiled_forker_is_for_this_interpreter() -> None:
    code = process_supervisor.compiled()
    assert code[:4] == importlib.util.MAGIC_NUMBER
    assert code[4:8] == (1).to_bytes(4, "little")  # hash-based, unchecked: no stat per start
