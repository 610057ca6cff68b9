"""`heteroflow apply -f`, `heteroflow delete -f` and `heteroflow get KIND NAME`: workload
files (heteroflow/files, docs/cli.md#files) against the API, through heteroflow.client.

Each document is matched by kind and name within the tenant: absent, it is created; present,
its fields are compared with the file's and what differs is shown, then changed with the
route the kind has for it (a group's image, env or volumes: a rollout; its size: a scale;
its window, auto_scale or idle timeout: an update). A change no route can make in place is
refused naming the field, and nothing of that document is written.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import textwrap
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TextIO

import yaml

from heteroflow.client import ApiError, AsyncClient, Unreachable
from heteroflow.files import kinds
from heteroflow.files.load import ALIASES, KINDS, Document, FileError, load

from .client import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNREACHABLE,
    CliError,
    UsageError,
    resolve_target,
)
from .plan import plan_text

ACTIVE_ROLLOUT = frozenset({"running", "paused"})
PLANNED = frozenset({"Task", "TaskGroup", "Job"})  # kinds with a POST .../plan route


@dataclass
class Clients:
    """The tenant's client; queues and pools are written with the operator's."""

    tenant: AsyncClient
    operator: AsyncClient | None = None

    def of(self, kind: str) -> AsyncClient:
        if kind in ("Queue", "Pool") and self.operator is not None:
            return self.operator
        return self.tenant


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(", ", ": "))


async def _get(c: AsyncClient, path: str, **params: Any) -> dict[str, Any] | None:
    try:
        return await c.request("GET", path, params=params or None)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


async def _paged(c: AsyncClient, path: str, key: str, **params: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    page = 1
    while True:
        data = await c.request("GET", path, params={**params, "page": page, "per_page": 100})
        items = list(data.get(key) or [])
        out.extend(items)
        if not items or page * 100 >= int(data.get("total") or 0):
            return out
        page += 1


async def find(clients: Clients, kind: str, name: str) -> dict[str, Any] | None:
    """The live object of `kind` named `name` (the newest, if several), as the API shows it
    in detail; a group's template is the one an active rollout is moving to."""
    c, path = clients.of(kind), kinds.PATHS[kind]
    if kind in ("Queue", "Pool"):
        return await _get(c, f"{path}/{name}")
    if kind == "Job":
        found = [j for j in await _paged(c, path, "jobs") if j.get("name") == name]
    else:
        key = "tasks" if kind == "Task" else "groups"
        found = [x for x in await _paged(c, path, key, name=name) if x.get("name") == name]
    if not found:
        return None
    newest = max(found, key=lambda x: str(x.get("created_at", "")))
    view = await _get(c, f"{path}/{newest['id']}")
    if view is None:
        return None
    if kind == "Job":  # the view shows progress; the submission is its first event
        events = (await _get(c, f"{path}/{newest['id']}/events") or {}).get("events") or []
        first: dict[str, Any] = next(
            (e["payload"] for e in events if e.get("type") == "job_submitted"), {}
        )
        view = view | {"spec": first.get("spec") or {}}
    if kind == "TaskGroup":
        rollout = await _get(c, f"{path}/{newest['id']}/rollout") or {}
        request = rollout.get("request") or {}
        if rollout.get("phase") in ACTIVE_ROLLOUT:
            moving = {k: request[k] for k in kinds.ROLLOUT_FIELDS if request.get(k) is not None}
            view = view | {"template": dict(view["template"]) | moving}
    return view


def _ident(kind: str, doc_name: str, view: dict[str, Any]) -> str:
    return doc_name if kind in ("Queue", "Pool") else str(view["id"])


class Applier:
    """Applies documents one by one, writing what it does to `out` (errors to `err`)."""

    def __init__(self, clients: Clients, out: TextIO, err: TextIO, *, dry_run: bool) -> None:
        self.clients, self.out, self.err, self.dry_run = clients, out, err, dry_run
        self.failed = False

    def say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def refuse(self, message: str) -> None:
        self.failed = True
        print(f"error: {message}", file=self.err, flush=True)

    def refused_by_server(self, doc: Document, exc: ApiError) -> None:
        field = kinds.api_field(exc.fields[0]) if exc.fields else ""
        self.refuse(str(doc.error(field, exc.message)) if field else f"{doc.where}: {exc}")

    async def apply(self, doc: Document) -> None:
        c, path = self.clients.of(doc.kind), kinds.PATHS[doc.kind]
        view = await find(self.clients, doc.kind, doc.name)
        if view is None:
            if self.dry_run:
                self.say(f"{doc.ref} would be created")
                await self._plan(doc, c, path)
                return
            try:
                made = await c.request("POST", path, body=kinds.body_of(doc))
            except ApiError as exc:
                self.refused_by_server(doc, exc)
                return
            self.say(f"{doc.ref} created" + (f" ({made['id']})" if "id" in made else ""))
            return
        want = kinds.desired(doc)
        plan = kinds.plan(doc, want, kinds.live(doc.kind, view, want), view)
        if plan.unchanged:
            self.say(f"{doc.ref} unchanged" + "".join(f" ({n})" for n in plan.notes))
            return
        self.say(f"{doc.ref} {'would change' if self.dry_run else 'changed'}:")
        for ch in plan.changes:
            how = self._how(ch.field, plan)
            self.say(f"  {ch.field}: {_show(ch.before)} -> {_show(ch.after)}  ({how})")
        for note in plan.notes:
            self.say(f"  note: {note}")
        if plan.fixed:
            fields = ", ".join(plan.fixed)
            what = "a job" if doc.kind == "Job" else f"a {doc.kind}"
            self.refuse(
                f"{doc.where}: {fields} of {what} cannot be updated in place: delete it "
                "(heteroflow delete -f FILE) and apply again; nothing of it was changed"
            )
            return
        if not self.dry_run:
            await self._write(doc, c, f"{path}/{_ident(doc.kind, doc.name, view)}", plan)

    async def _plan(self, doc: Document, c: AsyncClient, path: str) -> None:
        """Where the creation would be placed (POST .../plan, for the kinds that have it)."""
        if doc.kind not in PLANNED:
            return
        try:
            answer = await c.request("POST", f"{path}/plan", body=kinds.body_of(doc))
        except ApiError as exc:
            self.refused_by_server(doc, exc)
            return
        self.say(textwrap.indent(plan_text(answer), "  "))

    @staticmethod
    def _how(field: str, plan: kinds.Plan) -> str:
        if field in plan.fixed:
            return "not in place"
        if field in plan.rollout:
            return "rollout"
        return "scale" if field == "task_count" and plan.scale is not None else "update"

    async def _write(self, doc: Document, c: AsyncClient, at: str, plan: kinds.Plan) -> None:
        try:
            if plan.update:
                await c.request("PUT", at, body=plan.update)
                self.say(f"{doc.ref} updated")
            if plan.scale is not None:
                await c.request("POST", f"{at}/scale", body={"replicas": plan.scale})
                self.say(f"{doc.ref} scaled to {plan.scale}")
            if plan.rollout:
                started = await c.request("POST", f"{at}/rollout", body=plan.rollout)
                self.say(f"{doc.ref} rollout started ({started.get('rollout_id')})")
        except ApiError as exc:
            self.refused_by_server(doc, exc)

    async def delete(self, doc: Document) -> None:
        c, path = self.clients.of(doc.kind), kinds.PATHS[doc.kind]
        view = await find(self.clients, doc.kind, doc.name)
        if view is None:
            self.say(f"{doc.ref} not found (nothing to delete)")
            return
        if self.dry_run:
            self.say(f"{doc.ref} would be deleted")
            return
        try:
            await c.request("DELETE", f"{path}/{_ident(doc.kind, doc.name, view)}")
        except ApiError as exc:
            self.refused_by_server(doc, exc)
            return
        self.say(f"{doc.ref} deleted")


def ordered(docs: list[Document], *, reverse: bool = False) -> list[Document]:
    """Pools before the queues that name them, queues before the work that waits in them."""
    return sorted(docs, key=lambda d: KINDS.index(d.kind), reverse=reverse)


async def apply_files(
    clients: Clients, docs: list[Document], out: TextIO, err: TextIO, *, dry_run: bool = False
) -> int:
    applier = Applier(clients, out, err, dry_run=dry_run)
    for doc in docs:
        kinds.check(doc)  # every document is checked before anything is written
    for doc in ordered(docs):
        await applier.apply(doc)
    if dry_run:
        print("dry run: nothing was written", file=out, flush=True)
    return EXIT_FAILED if applier.failed else EXIT_OK


async def delete_files(
    clients: Clients, docs: list[Document], out: TextIO, err: TextIO, *, dry_run: bool = False
) -> int:
    applier = Applier(clients, out, err, dry_run=dry_run)
    for doc in ordered(docs, reverse=True):
        await applier.delete(doc)
    return EXIT_FAILED if applier.failed else EXIT_OK


async def get_document(clients: Clients, kind: str, name: str) -> dict[str, Any] | None:
    view = await find(clients, kind, name)
    return None if view is None else kinds.document_of(kind, name, view)


def render(document: dict[str, Any], output: str | None) -> str:
    if output == "json":
        return json.dumps(document, indent=2) + "\n"
    text: str = yaml.safe_dump(document, sort_keys=False, allow_unicode=True)
    return text


# --- the commands --------------------------------------------------------------------------


def _client(args: argparse.Namespace, *, operator: bool) -> AsyncClient:
    """A client on the server and credential the other commands would use (docs/cli.md)."""
    target = resolve_target(args.server, args.token, operator=operator)
    if not target.token:
        raise UsageError(
            "no credential: pass --token, set HETEROFLOW_TOKEN, or start the platform "
            f"with `heteroflow up` to create {target.credentials_path}"
        )
    return AsyncClient(target.server, target.token, credentials_path=target.credentials_path)


def _clients(args: argparse.Namespace, operator_too: bool) -> Clients:
    as_operator = bool(getattr(args, "as_operator", False))
    tenant = _client(args, operator=as_operator)
    operator = None
    if operator_too and not as_operator and args.token is None:
        operator = _client(args, operator=True)
    return Clients(tenant, operator)


async def _with_clients(
    args: argparse.Namespace, operator_too: bool, work: Callable[[Clients], Awaitable[int]]
) -> int:
    clients = _clients(args, operator_too)
    try:
        return await work(clients)
    finally:
        await clients.tenant.aclose()
        if clients.operator is not None:
            await clients.operator.aclose()


def _entry(run: Callable[[argparse.Namespace], Coroutine[Any, Any, int]]) -> Callable[..., int]:
    def main(args: argparse.Namespace) -> int:
        try:
            return asyncio.run(run(args))
        except FileError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return EXIT_FAILED
        except ApiError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return EXIT_NOT_FOUND if exc.status == 404 else EXIT_FAILED
        except Unreachable as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return EXIT_UNREACHABLE
        except CliError as exc:  # no usable credential
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return exc.exit_code
        except KeyboardInterrupt:
            return 130

    return main


async def cmd_apply(args: argparse.Namespace) -> int:
    docs = load(args.filename)
    writes_operator_kinds = any(d.kind in ("Queue", "Pool") for d in docs)
    return await _with_clients(
        args,
        writes_operator_kinds,
        lambda c: apply_files(c, docs, sys.stdout, sys.stderr, dry_run=args.dry_run),
    )


async def cmd_delete(args: argparse.Namespace) -> int:
    docs = load(args.filename)
    writes_operator_kinds = any(d.kind in ("Queue", "Pool") for d in docs)
    return await _with_clients(
        args,
        writes_operator_kinds,
        lambda c: delete_files(c, docs, sys.stdout, sys.stderr, dry_run=args.dry_run),
    )


async def cmd_get(args: argparse.Namespace) -> int:
    kind = ALIASES.get(args.kind.lower())
    if kind is None:
        print(f"error: unknown kind {args.kind!r} ({', '.join(KINDS)})", file=sys.stderr)
        return EXIT_FAILED

    async def work(clients: Clients) -> int:
        document = await get_document(clients, kind, args.name)
        if document is None:
            print(f"error: {kind}/{args.name} not found", file=sys.stderr, flush=True)
            return EXIT_NOT_FOUND
        sys.stdout.write(render(document, getattr(args, "output", None)))
        return EXIT_OK

    return await _with_clients(args, kind in ("Queue", "Pool"), work)


def register_file_commands(sub: Any) -> None:
    """`apply`, `delete` and `get` on the `heteroflow` parser, after the user commands (whose
    connection and output options they share: the top-level copies are added there)."""
    from heteroflow.cli_user import _connection_options, _output_option

    conn = argparse.ArgumentParser(add_help=False)
    _connection_options(conn, argparse.SUPPRESS)
    fmt = argparse.ArgumentParser(add_help=False)
    _output_option(fmt, argparse.SUPPRESS)
    for name, handler, text in (
        ("apply", cmd_apply, "create or update what workload files describe (docs/cli.md)"),
        ("delete", cmd_delete, "delete what workload files describe"),
    ):
        p = sub.add_parser(name, parents=[conn], help=text)
        p.add_argument(
            "-f",
            "--filename",
            action="append",
            required=True,
            metavar="FILE|DIR",
            help="YAML or JSON file, a directory of them, or - (stdin); repeatable",
        )
        p.add_argument(
            "--dry-run", action="store_true", help="show what would change; write nothing"
        )
        p.set_defaults(func=_entry(handler))
    p = sub.add_parser(
        "get",
        parents=[conn, fmt],
        help="an object as a workload file (-o yaml, the default, or json)",
    )
    p.add_argument("kind", help=f"{', '.join(KINDS)} (any case; group for TaskGroup)")
    p.add_argument("name")
    p.set_defaults(func=_entry(cmd_get))
