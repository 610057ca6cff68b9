"""The payload base classes and the catalogue every aggregate's events register in."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

from libs.domain.reasons import REASON_SCHEMA_VERSION, ReasonCode, upcast_reason


class Payload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    type: ClassVar[str]
    stream_type: ClassVar[str]
    schema_version: int = 1


class ReasonedPayload(Payload):
    """A payload that says why: a code for programs, free text for people.

    Version 2 added `reason_code`. A stored version-1 payload (text only) is upcast when it
    is loaded: the code is derived from its text once, by `reasons.legacy_reason_code`.
    """

    schema_version: int = REASON_SCHEMA_VERSION
    reason_code: ReasonCode
    reason: str = ""

    @model_validator(mode="before")
    @classmethod
    def _upcast(cls, data: Any) -> Any:
        return upcast_reason(cls.type, data)


PAYLOAD_TYPES: dict[str, type[Payload]] = {}


def register(*classes: type[Payload]) -> None:
    """Add payload types to the catalogue (each domain module registers its own)."""
    for cls in classes:
        if PAYLOAD_TYPES.setdefault(cls.type, cls) is not cls:
            raise ValueError(f"event type {cls.type} registered twice")


def parse_payload(event_type: str, data: dict[str, Any]) -> Payload:
    """Parse a stored payload; import `libs.domain.catalog` so every module has registered."""
    return PAYLOAD_TYPES[event_type].model_validate(data)
