"""Typed event handlers: a consumer receives the payload's model, never a payload dict.

A durable subscription on ``hf.events.…`` delivers `EventEnvelope`s whose payload is JSON
whose schema depends on `type`. `EventHandlers` maps event types to handlers of the form
``async def on_failed(env: EventEnvelope, ev: TaskStatusChanged) -> None``: the payload type is
read from the handler's annotation, the envelope's payload parsed into it (upcasts included)
and the handler called. An event of a type no handler names is skipped (acknowledged); one
whose payload does not parse raises, so the broker naks it and, past `max_deliver`, it goes to
the dead-letter queue.

    handlers = EventHandlers.of(on_failed, on_created)
    routes.durable(EventEnvelope, handlers, stream=..., durable=..., subject=...)

`tests/unit/test_architecture.py` walks every registered handler's signature and fails on one
that takes a `dict` payload.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from libs.domain.catalog import PAYLOAD_TYPES, Payload
from libs.domain.envelope import EventEnvelope

OnEvent = Callable[[EventEnvelope, Any], Awaitable[None]]

# Every EventHandlers built in this process, for the architecture test to walk.
REGISTERED: list[EventHandlers] = []


def payload_type(handler: OnEvent) -> type[Payload]:
    """The payload model a handler takes: its second parameter's annotation."""
    params = list(inspect.signature(handler).parameters.values())
    if len(params) < 2:
        raise TypeError(f"{_name(handler)} must take (envelope, payload)")
    hints = typing.get_type_hints(handler)
    model = hints.get(params[1].name)
    if not (isinstance(model, type) and issubclass(model, Payload)):
        raise TypeError(
            f"{_name(handler)}: the payload parameter {params[1].name!r} must be annotated "
            f"with a payload model, not {model!r}"
        )
    if PAYLOAD_TYPES.get(model.type) is not model:
        raise TypeError(f"{_name(handler)}: {model.__name__} is not a registered payload type")
    return model


def _name(handler: Any) -> str:
    return getattr(handler, "__qualname__", repr(handler))


@dataclass(frozen=True)
class EventHandlers:
    """Event type -> (payload model, handler); callable as a durable consumer's handler."""

    by_type: Mapping[str, tuple[type[Payload], OnEvent]]
    owner: str = field(default="")

    @classmethod
    def of(cls, *handlers: OnEvent, owner: str = "") -> EventHandlers:
        by_type: dict[str, tuple[type[Payload], OnEvent]] = {}
        for handler in handlers:
            model = payload_type(handler)
            if model.type in by_type:
                raise ValueError(f"two handlers for {model.type}")
            by_type[model.type] = (model, handler)
        made = cls(by_type, owner)
        REGISTERED.append(made)
        return made

    @property
    def types(self) -> frozenset[str]:
        return frozenset(self.by_type)

    def handlers(self) -> Iterable[OnEvent]:
        return (h for _, h in self.by_type.values())

    def parse(self, envelope: EventEnvelope) -> Payload | None:
        """The envelope's payload as its model, or None when no handler takes its type."""
        entry = self.by_type.get(envelope.type)
        return entry[0].model_validate(envelope.payload) if entry else None

    async def __call__(self, envelope: EventEnvelope) -> None:
        entry = self.by_type.get(envelope.type)
        if entry is None:
            return
        model, handler = entry
        await handler(envelope, model.model_validate(envelope.payload))


__all__ = ["REGISTERED", "EventHandlers", "OnEvent", "payload_type"]
