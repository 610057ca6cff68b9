"""`.ci/run` runs the README's test command verbatim, after the lint checks, and its exit
status is the verdict: any lint finding fails it before a test runs; pytest's "no tests
collected" (5) does not fail it; any other pytest failure does.

The script runs for real in a scratch copy of `.ci/` whose `python3`, `pip`, `pytest` and
linters are stand-ins that record their call and exit as told."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# What the fake venv's tools do: log their name, exit with the status the test chose.
FAKE_TOOL = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$CALLS"
var="RC_$(basename "$0" | tr a-z- A-Z_)"
exit "${!var:-0}"
"""
# `python3 -m venv .venv` makes a venv whose activate puts the fake tools first on PATH.
FAKE_PYTHON3 = """#!/usr/bin/env bash
echo "python3 $*" >> "$CALLS"
mkdir -p .venv/bin
for tool in pip pytest ruff mypy; do cp "$FAKE_TOOL_FILE" ".venv/bin/$tool"; done
echo 'export PATH="$PWD/.venv/bin:$PATH"' > .venv/bin/activate
"""


def readme_test_command() -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"# install and run the tests\n(.+)\n", text)
    assert match, "README has no test command"
    return match.group(1).strip()


def test_ci_runs_the_readme_test_command_verbatim_after_the_lint() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    command = readme_test_command()
    assert command in script
    assert script.index("bash .ci/lint") < script.rindex(command)


def run_ci(tmp_path: Path, **rcs: int) -> tuple[int, list[str]]:
    work = tmp_path / "repo"
    shutil.copytree(ROOT / ".ci", work / ".ci")
    (work / ".ci" / "setup-docker.sh").write_text("exit 0\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTHON3)
    (bin_dir / "python3").chmod(0o755)
    tool = tmp_path / "tool"
    tool.write_text(FAKE_TOOL)
    tool.chmod(0o755)
    calls = tmp_path / "calls"
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "CALLS": str(calls),
        "FAKE_TOOL_FILE": str(tool),
    } | {f"RC_{k.upper()}": str(v) for k, v in rcs.items()}
    proc = subprocess.run(
        ["bash", str(work / ".ci" / "run")], env=env, capture_output=True, timeout=30
    )
    lines = calls.read_text().splitlines() if calls.exists() else []
    return proc.returncode, [line.split()[0] for line in lines]


@pytest.mark.parametrize(
    ("rcs", "expected_rc", "pytest_runs"),
    [
        ({}, 0, True),
        ({"pytest": 1}, 1, True),
        ({"pytest": 5}, 0, True),
        ({"ruff": 1}, 1, False),
        ({"mypy": 1}, 1, False),
        ({"pip": 1}, 1, False),
    ],
    ids=["green", "tests-fail", "no-tests-collected", "ruff-finding", "mypy-finding", "no-install"],
)
def test_ci_verdict(
    tmp_path: Path, rcs: dict[str, int], expected_rc: int, pytest_runs: bool
) -> None:
    rc, calls = run_ci(tmp_path, **rcs)
    assert rc == expected_rc, calls
    assert ("pytest" in calls) is pytest_runs, calls
    if "pip" not in rcs:  # the linters ran from the venv, before any test
        assert calls.count("ruff") == 2 and "mypy" in calls
        if pytest_runs:
            assert calls.index("mypy") < calls.index("pytest")
