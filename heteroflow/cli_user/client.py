"""HTTP client of the user commands: where the server is, which credential, and the API's
refusals turned into exceptions that carry the command's exit code.

Server and token are resolved flags first, then `HETEROFLOW_SERVER` / `HETEROFLOW_TOKEN`,
then `$HETEROFLOW_HOME/credentials.json` (written by `heteroflow up`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx

DEFAULT_SERVER = "http://127.0.0.1:3333"
API_PREFIX = "/api/v1"
TIMEOUT_S = 30.0  # above the gateway's own waits (wake answers within 10 s)

EXIT_OK = 0
EXIT_FAILED = 1  # the task ended unsuccessfully, or the API refused the request (4xx)
EXIT_USAGE = 2  # bad arguments or no usable credential
EXIT_UNREACHABLE = 3  # no answer from the server, or a server error (5xx)
EXIT_NOT_FOUND = 4  # no such task or group, or an endpoint this server does not have


FRAMEWORK_MISSING = ("Not Found", "Method Not Allowed")


class CliError(Exception):
    """An error the command reports as `error: <message>` and exits with `exit_code`."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(CliError):
    exit_code = EXIT_USAGE


class Missing(CliError):
    exit_code = EXIT_NOT_FOUND


class Unreachable(CliError):
    exit_code = EXIT_UNREACHABLE


class ApiError(CliError):
    """A refusal in the API's shape `{"error", "code", "fields"}`."""

    def __init__(self, status: int, message: str, code: int | None, fields: list[str]) -> None:
        super().__init__(message)
        self.status, self.code, self.fields = status, code, fields
        # The path itself is unknown to this server: a framework 404/405, not a missing task.
        self.route_missing = status in (404, 405) and message in FRAMEWORK_MISSING
        if status in (404, 405):
            self.exit_code = EXIT_NOT_FOUND
        elif status >= 500:
            self.exit_code = EXIT_UNREACHABLE

    def __str__(self) -> str:
        return f"{self.message} (code {self.code})" if self.code else self.message


def home(env: Mapping[str, str] | None = None) -> Path:
    raw = (os.environ if env is None else env).get("HETEROFLOW_HOME")
    return Path(raw).expanduser() if raw else Path.home() / ".heteroflow"


def load_credentials(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
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
    """Flags, then environment, then the local credentials file (operator key on request)."""
    env = os.environ if env is None else env
    path = credentials_path or home(env) / "credentials.json"
    url = server or env.get("HETEROFLOW_SERVER")
    secret = token or env.get("HETEROFLOW_TOKEN")
    if not url or not secret:  # the file is read only when something is still missing
        creds = load_credentials(path)
        url = url or creds.get("url") or DEFAULT_SERVER
        secret = secret or creds.get("operator_token" if operator else "tenant_api_key")
    return Target(normalise_server(url), secret or None, path)


@dataclass
class SseEvent:
    event: str
    data: str


def parse_sse(lines: Iterable[str]) -> Iterator[SseEvent]:
    """Server-Sent Events from decoded lines: `event:`/`data:` fields, a blank line ends one."""
    event = "message"
    data: list[str] = []
    for line in lines:
        if line == "":
            if data or event != "message":
                yield SseEvent(event, "\n".join(data))
            event, data = "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
    if data:
        yield SseEvent(event, "\n".join(data))


def api_error(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "error" in body:
        code = body.get("code")
        return ApiError(
            response.status_code,
            str(body["error"]),
            int(code) if isinstance(code, int) else None,
            [str(f) for f in body.get("fields") or []],
        )
    text = response.text.strip()[:200] or response.reason_phrase
    return ApiError(response.status_code, f"HTTP {response.status_code}: {text}", None, [])


@dataclass
class Client:
    target: Target
    timeout: float = TIMEOUT_S
    _http: httpx.Client | None = field(default=None, repr=False)

    @property
    def http(self) -> httpx.Client:
        if self._http is None:
            if not self.target.token:
                raise UsageError(
                    "no credential: pass --token, set HETEROFLOW_TOKEN, or start the platform "
                    f"with `heteroflow up` to create {self.target.credentials_path}"
                )
            self._http = httpx.Client(
                base_url=self.target.server + API_PREFIX,
                headers={"Authorization": f"Bearer {self.target.token}"},
                timeout=self.timeout,
            )
        return self._http

    def close(self) -> None:
        if self._http is not None:
            self._http.close()

    def _unreachable(self, exc: httpx.HTTPError) -> Unreachable:
        return Unreachable(
            f"cannot reach the HeteroFlow server at {self.target.server}: {exc or type(exc)}"
            " (is it running? set --server or HETEROFLOW_SERVER)"
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> httpx.Response:
        try:
            response = self.http.request(method, path, params=params, json=body)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if response.status_code >= 400:
            error = api_error(response)
            if error.route_missing:
                error.message = (
                    f"the server at {self.target.server} has no {method} {API_PREFIX}{path}"
                    " endpoint; it is older than this client"
                )
            raise error
        return response

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params or None).json()

    def post(self, path: str, body: Any = None, **params: Any) -> httpx.Response:
        return self.request("POST", path, params=params or None, body=body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path).json()

    def events(self, path: str, **params: Any) -> Iterator[SseEvent]:
        """Follow a Server-Sent Events endpoint; errors before the stream starts raise."""
        timeout = httpx.Timeout(self.timeout, read=None)  # a quiet task sends nothing for long
        try:
            with self.http.stream("GET", path, params=params, timeout=timeout) as response:
                if response.status_code >= 400:
                    response.read()
                    raise api_error(response)
                yield from parse_sse(response.iter_lines())
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None


@dataclass
class Context:
    """What a command handler works with: the API client, the output format, the streams."""

    client: Client
    output: str = "table"
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)

    def print(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def note(self, text: str) -> None:
        """Progress and remarks go to stderr, so stdout stays the data."""
        print(text, file=self.err, flush=True)
