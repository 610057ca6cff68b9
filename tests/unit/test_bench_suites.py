"""Every benchmark suite keeps the contract `python -m bench` relies on (bench/__init__.py):
a `DESCRIPTION` for `--list`, `add_arguments(parser)` and `run(ctx)`."""

from __future__ import annotations

import importlib

import pytest

from bench import SUITE_NAMES
from bench.__main__ import main


@pytest.mark.parametrize("name", SUITE_NAMES)
def test_a_suite_has_what_the_runner_calls(name: str) -> None:
    suite = importlib.import_module(f"bench.{name}")
    assert isinstance(suite.DESCRIPTION, str) and suite.DESCRIPTION
    assert callable(suite.add_arguments) and callable(suite.run)


def test_list_names_every_suite(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == list(SUITE_NAMES)
