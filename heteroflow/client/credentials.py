"""Where the server is and which credential: arguments first, then `HETEROFLOW_SERVER` /
`HETEROFLOW_TOKEN`, then `$HETEROFLOW_HOME/credentials.json` (written by `heteroflow up`),
then the default server. The CLI and the Python client resolve them here, the same way."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SERVER = "http://127.0.0.1:3333"
API_PREFIX = "/api/v1"


class CredentialsError(ValueError):
    """The credentials file exists and cannot be read."""


def home(env: Mapping[str, str] | None = None) -> Path:
    raw = (os.environ if env is None else env).get("HETEROFLOW_HOME")
    return Path(raw).expanduser() if raw else Path.home() / ".heteroflow"


def load_credentials(path: Path) -> dict[str, str]:
    """The file's string entries; {} when there is no file."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise CredentialsError(f"cannot read {path}: {exc}") from None
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


@dataclass(frozen=True)
class Target:
    server: str
    token: str | None
    credentials_path: Path


def normalise_server(url: str) -> str:
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url.removesuffix(API_PREFIX)


def resolve_target(
    server: str | None,
    token: str | None,
    *,
    operator: bool = False,
    env: Mapping[str, str] | None = None,
    credentials_path: Path | None = None,
) -> Target:
    """Arguments, then environment, then the local credentials file (its operator token when
    `operator`, else its tenant key)."""
    env = os.environ if env is None else env
    path = credentials_path or home(env) / "credentials.json"
    url = server or env.get("HETEROFLOW_SERVER")
    secret = token or env.get("HETEROFLOW_TOKEN")
    if not url or not secret:  # the file is read only when something is still missing
        creds = load_credentials(path)
        url = url or creds.get("url") or DEFAULT_SERVER
        secret = secret or creds.get("operator_token" if operator else "tenant_api_key")
    return Target(normalise_server(url), secret or None, path)
