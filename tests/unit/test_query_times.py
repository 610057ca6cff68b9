"""A time in a query is ISO 8601 as the OpenAPI document declares (`format: date-time`): a bare
number, which pydantic alone would read as Unix seconds, is refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.api_gateway.schemas import GpuMetricsQuery


@pytest.mark.parametrize("value", ["0", "1.5", "-3", "1e9", " 12 "])
def test_a_number_is_not_a_time(value: str) -> None:
    with pytest.raises(ValidationError, match="ISO 8601"):
        GpuMetricsQuery.model_validate({"start": value})


def test_an_iso_time_is_read() -> None:
    q = GpuMetricsQuery.model_validate(
        {"start": "2026-12-01T00:00:00Z", "end": "2026-12-01T01:00:00+00:00"}
    )
    assert q.start is not None and q.end is not None and (q.end - q.start).total_seconds() == 3600
