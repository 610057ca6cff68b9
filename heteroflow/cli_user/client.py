"""The user commands' view of the Python client (heteroflow.client): where the server is,
which credential, and the API's refusals turned into exceptions that carry the command's
exit code.

Server and token are resolved flags first, then `HETEROFLOW_SERVER` / `HETEROFLOW_TOKEN`,
then `$HETEROFLOW_HOME/credentials.json` (written by `heteroflow up`), by
heteroflow.client.credentials; the HTTP calls, their retries and the event streams are
heteroflow.client's.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx

from heteroflow import client as hf
from heteroflow.client import credentials
from heteroflow.client.core import SseEvent, parse_sse
from heteroflow.client.credentials import (
    API_PREFIX,
    DEFAULT_SERVER,
    Target,
    home,
    normalise_server,
)

__all__ = [
    "API_PREFIX",
    "DEFAULT_SERVER",
    "SseEvent",
    "Target",
    "home",
    "normalise_server",
    "parse_sse",
]

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

    @classmethod
    def of(cls, exc: hf.ApiError) -> ApiError:
        return cls(exc.status, exc.message, exc.code, exc.fields)


def load_credentials(path: Path) -> dict[str, str]:
    try:
        return credentials.load_credentials(path)
    except credentials.CredentialsError as exc:
        raise UsageError(str(exc)) from None


def resolve_target(
    server: str | None,
    token: str | None,
    *,
    operator: bool = False,
    env: Mapping[str, str] | None = None,
    credentials_path: Path | None = None,
) -> Target:
    """Flags, then environment, then the local credentials file (operator key on request)."""
    try:
        return credentials.resolve_target(
            server, token, operator=operator, env=env, credentials_path=credentials_path
        )
    except credentials.CredentialsError as exc:
        raise UsageError(str(exc)) from None


def api_error(response: httpx.Response) -> ApiError:
    return ApiError.of(hf.core.api_error(response))


@dataclass
class Client:
    """The commands' client: a heteroflow.client.Client made on first use (so a command
    without a credential fails only when it calls the API), its errors as CliErrors."""

    target: Target
    timeout: float = TIMEOUT_S
    _http: httpx.Client | None = field(default=None, repr=False)
    _api: hf.Client | None = field(default=None, repr=False)

    @property
    def api(self) -> hf.Client:
        if self._api is None:
            if not self.target.token:
                raise UsageError(
                    "no credential: pass --token, set HETEROFLOW_TOKEN, or start the platform "
                    f"with `heteroflow up` to create {self.target.credentials_path}"
                )
            self._api = hf.Client(
                self.target.server,
                self.target.token,
                credentials_path=self.target.credentials_path,
                timeout=self.timeout,
                http=self._http,
            )
        return self._api

    def close(self) -> None:
        if self._api is not None:
            self._api.close()
        elif self._http is not None:
            self._http.close()

    def _unreachable(self, exc: hf.Unreachable) -> Unreachable:
        return Unreachable(
            f"cannot reach the HeteroFlow server at {self.target.server}: {exc.reason}"
            " (is it running? set --server or HETEROFLOW_SERVER)"
        )

    def _refused(self, exc: hf.ApiError, method: str, path: str) -> ApiError:
        error = ApiError.of(exc)
        if error.route_missing:
            error.message = (
                f"the server at {self.target.server} has no {method} {API_PREFIX}{path}"
                " endpoint; it is older than this client"
            )
        return error

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> httpx.Response:
        try:
            return self.api.send(method, path, params=params, body=body)
        except hf.Unreachable as exc:
            raise self._unreachable(exc) from None
        except hf.ApiError as exc:
            raise self._refused(exc, method, path) from None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params or None).json()

    def post(self, path: str, body: Any = None, **params: Any) -> httpx.Response:
        return self.request("POST", path, params=params or None, body=body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path).json()

    def events(self, path: str, **params: Any) -> Iterator[SseEvent]:
        """Follow a Server-Sent Events endpoint; errors before the stream starts raise."""
        try:
            yield from self.api.events(path, **params)
        except hf.Unreachable as exc:
            raise self._unreachable(exc) from None
        except hf.ApiError as exc:
            raise ApiError.of(exc) from None


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
