"""The event catalogue as an AsyncAPI 2.6 document, generated from the payload models.

Committed as docs/asyncapi.json; a test regenerates it so it cannot drift from the code.
Run `python -m libs.bus.asyncapi > docs/asyncapi.json` after changing an event or message.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from libs.domain.catalog import PAYLOAD_TYPES
from libs.domain.protocol import AgentReport, Heartbeat, NodeCommand, Registration

from . import subjects as s

ENVELOPE_FIELDS = {
    "event_id": {"type": "string", "format": "uuid", "description": "Nats-Msg-Id as well"},
    "position": {"type": "integer", "description": "global store position (not commit order)"},
    "stream_id": {"type": "string"},
    "stream_type": {"type": "string"},
    "version": {"type": "integer", "description": "version within the stream, gap-free"},
    "type": {"type": "string"},
    "schema_version": {"type": "integer"},
    "occurred_at": {"type": "string", "format": "date-time"},
    "metadata": {"type": "object"},
}


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema(ref_template="#/components/schemas/{model}")


def _lift(schema: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    for name, sub in schema.pop("$defs", {}).items():
        out[name] = sub
    return schema


def document() -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    channels: dict[str, Any] = {}
    for name, cls in sorted(PAYLOAD_TYPES.items()):
        payload = _lift(_schema(cls), schemas)
        schemas[cls.__name__] = payload
        messages[name] = {
            "name": name,
            "title": cls.__name__,
            "summary": (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else name,
            "payload": {
                "type": "object",
                "properties": ENVELOPE_FIELDS
                | {"payload": {"$ref": f"#/components/schemas/{cls.__name__}"}},
                "required": ["event_id", "stream_id", "version", "type", "payload"],
            },
        }
        channel = f"{s.EVENTS_PREFIX}.{cls.stream_type}.{{stream_id}}.{name}"
        channels[channel] = {
            "description": f"{name} events of {cls.stream_type} streams, stream {s.EVENTS_STREAM}",
            "parameters": {"stream_id": {"schema": {"type": "string"}}},
            "subscribe": {"message": {"$ref": f"#/components/messages/{name}"}},
        }
    node_messages: dict[str, type[BaseModel]] = {
        "node_command": NodeCommand,
        "agent_report": AgentReport,
        "registration": Registration,
        "heartbeat": Heartbeat,
    }
    for name, model in node_messages.items():
        schemas[model.__name__] = _lift(_schema(model), schemas)
        messages[name] = {
            "name": name,
            "title": model.__name__,
            "payload": {"$ref": f"#/components/schemas/{model.__name__}"},
        }
    node = {"parameters": {"node_id": {"schema": {"type": "string"}}}}
    channels[f"{s.NODE_PREFIX}.{{node_id}}.cmd"] = node | {
        "description": f"commands for one agent (stream {s.NODE_STREAM}, durable per agent)",
        "subscribe": {"message": {"$ref": "#/components/messages/node_command"}},
    }
    channels[f"{s.NODE_PREFIX}.{{node_id}}.report"] = node | {
        "description": f"reports and registrations from one agent (stream {s.NODE_STREAM})",
        "publish": {
            "message": {
                "oneOf": [
                    {"$ref": "#/components/messages/agent_report"},
                    {"$ref": "#/components/messages/registration"},
                ]
            }
        },
    }
    channels[f"{s.NODE_PREFIX}.{{node_id}}.heartbeat"] = node | {
        "description": "liveness beats (core NATS, not stored)",
        "publish": {"message": {"$ref": "#/components/messages/heartbeat"}},
    }
    return {
        "asyncapi": "2.6.0",
        "info": {
            "title": "HeteroFlow events",
            "version": "1.0.0",
            "description": "Domain events published by the outbox relay, and the node "
            "agent protocol. See docs/events.md.",
        },
        "defaultContentType": "application/json",
        "channels": dict(sorted(channels.items())),
        "components": {"messages": messages, "schemas": dict(sorted(schemas.items()))},
    }


def render() -> str:
    return json.dumps(document(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(render(), end="")
