"""The console's plumbing: the session cookie, CSRF, the security headers, rendering, and the
in-process API client every page reads through (routes.py, groups.py and jobs.py hold
the pages).

A page that cannot go on (no session, a refused API call, a bad form) raises `Stop` with the
answer to give; `install` turns it into that answer, so handlers hold only the happy path.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qsl

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from .forms import field_problems

HERE = Path(__file__).parent
STATIC = HERE / "static"
COOKIE = "hf_console"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
templates = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(["html"]),
    enable_async=False,
)


class Stop(Exception):
    """End the page with `response` (a redirect to sign in, an error page)."""

    def __init__(self, response: Response) -> None:
        self.response = response


def install(app: FastAPI) -> None:
    async def stopped(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, Stop)
        return exc.response

    app.add_exception_handler(Stop, stopped)


def csrf_token(key: str) -> str:
    return hmac.new(key.encode(), b"heteroflow-console-csrf", hashlib.sha256).hexdigest()[:32]


def secured(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    # same-origin, not no-referrer: with no-referrer a browser sends `Origin: null` on form
    # posts, and the origin check below could not tell ours from a forgery.
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cache-Control"] = "no-store"
    return response


def page(request: Request, name: str, status: int = 200, **context: Any) -> Response:
    key = request.cookies.get(COOKIE, "")
    html = templates.get_template(name).render(
        csrf=csrf_token(key) if key else "", signed_in=bool(key), **context
    )
    return secured(HTMLResponse(html, status))


def not_found(request: Request, what: str = "no such page") -> Response:
    return page(request, "error.html", 404, title="Not found", message=what)


def go(url: str) -> Response:
    return secured(RedirectResponse(url, 303))


async def create(
    request: Request,
    key: str,
    posted: tuple[dict[str, Any], dict[str, str]],
    api_path: str,
    ui_path: str,
) -> Response | dict[str, str]:
    """Create from a form: `posted` is the body read from it and the problems found on the
    way. A redirect to the new object's page once the API answers 201; else the problems to
    show beside their fields (the form's own, or the API's refusal)."""
    body, problems = posted
    if problems:
        return problems
    async with api_client(request, key) as api:
        r = await api.post(api_path, json=body)
    if r.status_code == 201:
        return go(f"{ui_path}/{r.json()['id']}")
    return field_problems(r.json(), r.text)


def api_client(request: Request, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=request.app),
        base_url="http://console/api/v1",
        headers={"Authorization": f"Bearer {key}"},
        timeout=httpx.Timeout(10.0),
    )


async def session_key(request: Request) -> str:
    """The signed-in key; without one the page is the sign-in page. (async: FastAPI runs a
    plain `def` dependency in a worker thread.)"""
    key = request.cookies.get(COOKIE, "")
    if not key:
        raise Stop(go("/ui/login"))
    return key


Key = Annotated[str, Depends(session_key)]


def same_origin(request: Request) -> bool:
    """A change must come from this origin (checked beside the CSRF token)."""
    origin = request.headers.get("origin")
    if origin is None:
        return request.headers.get("sec-fetch-site", "same-origin") == "same-origin"
    return origin == f"{request.url.scheme}://{request.url.netloc}"


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form (what the console's pages post); anything else reads as empty."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/x-www-form-urlencoded":
        return {}
    try:
        text = (await request.body()).decode("utf-8")
    except UnicodeDecodeError:
        return {}
    return dict(parse_qsl(text, keep_blank_values=True))


async def checked_form(request: Request, key: Key) -> dict[str, str]:
    """The posted form of a signed-in change, its CSRF token and origin checked."""
    form = await read_form(request)
    token = form.pop("csrf", "")
    if not same_origin(request) or not hmac.compare_digest(token, csrf_token(key)):
        message = "the form's security token is missing or stale: reload the page"
        raise Stop(page(request, "error.html", 403, title="Refused", message=message))
    return form


Form = Annotated[dict[str, str], Depends(checked_form)]


def refused(request: Request, r: httpx.Response) -> Response:
    """The API's refusal as a page (a key that stopped working: back to sign in)."""
    if r.status_code == 401:
        response = go("/ui/login")
        response.delete_cookie(COOKIE, path="/ui")
        return response
    try:
        message = r.json().get("error", r.text)
    except ValueError:
        message = r.text
    titles = {403: "Not allowed", 404: "Not found"}
    title = titles.get(r.status_code, "Refused")
    return page(request, "error.html", r.status_code, title=title, message=message)


def ok(request: Request, r: httpx.Response) -> Any:
    """The answer's body, or `Stop` with the refusal page."""
    if r.status_code >= 400:
        raise Stop(refused(request, r))
    return r.json() if r.content else None


def if_ok(r: httpx.Response) -> Any:
    """The body of a side read the page can do without (None when refused)."""
    return r.json() if r.status_code == 200 else None
