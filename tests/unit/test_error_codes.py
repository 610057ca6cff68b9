"""docs/api.md's error table and the codes the platform answers agree (SPEC §2, seed 002)."""

from __future__ import annotations

import re
from pathlib import Path

from libs.domain.errors import HTTP_STATUS, Code
from services.api_gateway.errors import INTERNAL_ERROR

API_MD = Path(__file__).resolve().parents[2] / "docs" / "api.md"
ROW = re.compile(r"^\| (\d{3}) \| (\d{5}) \|", re.MULTILINE)


def documented() -> dict[int, int]:
    """code → HTTP status, from the table under `## Errors`."""
    text = API_MD.read_text()
    section = text[text.index("## Errors") : text.index("\n## ", text.index("## Errors") + 1)]
    rows = [(int(status), int(code)) for status, code in ROW.findall(section)]
    table = dict((code, status) for status, code in rows)
    assert len(table) == len(rows), "a code documented twice"
    return table


def test_every_code_is_documented_with_its_http_status() -> None:
    table = documented()
    assert table == {int(c): HTTP_STATUS[c] for c in Code} | {INTERNAL_ERROR: 500}
    for code, status in table.items():
        assert code // 100 == status, f"{code} answered with HTTP {status}"  # SPEC §2 pattern


def test_node_unreachable_is_http_500_as_seed_002_says() -> None:
    assert HTTP_STATUS[Code.NODE_UNREACHABLE] == 500


def test_scheduling_failure_is_never_answered_and_says_why() -> None:
    """Placement is asynchronous: nothing raises 50001, so nothing defines it, and the page
    says so (and what is answered instead)."""
    assert 50001 not in {int(c) for c in Code}
    assert 50001 not in documented()
    text = API_MD.read_text()
    assert "50001 (scheduling failure) is never answered" in text
