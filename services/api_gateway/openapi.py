"""Print the gateway's OpenAPI document (committed as docs/openapi.json, checked by a test)."""

from __future__ import annotations

import json
from typing import Any

from libs.config import GatewaySettings

from .app import create_app


def document() -> dict[str, Any]:
    return create_app(GatewaySettings()).openapi()


def render() -> str:
    return json.dumps(document(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(render(), end="")
