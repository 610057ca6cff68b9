"""Docs that restate code are checked against it."""

from __future__ import annotations

from pathlib import Path

from libs.domain.reasons import ReasonCode
from libs.domain.task.states import TRANSITIONS, TaskStatus

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_state_machine_page_matches_whitelist() -> None:
    text = (DOCS / "state-machine.md").read_text()
    for src in TaskStatus:
        row = next(line for line in text.splitlines() if line.startswith(f"| `{src.value}` |"))
        listed = {part.strip(" `") for part in row.split("|")[2].split(",")}
        expected = {t.value for t in TRANSITIONS[src]} or {"— (terminal)"}
        assert listed == expected, src


def test_events_page_lists_every_reason_code() -> None:
    rows = set((DOCS / "events.md").read_text().splitlines())
    for code in ReasonCode:
        assert f"| `{code.value}` | {code.text} |" in rows, code
