"""Reading workload files: YAML or JSON, one or several documents per file, each
`{apiVersion, kind, metadata: {name}, spec}`, with the line of every field kept so that a
refusal (ours or the server's) names the document, the line and the field."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

API_VERSION = "heteroflow/v1"
KINDS = ("Pool", "Queue", "Task", "TaskGroup", "Job")  # the order apply creates them in
ALIASES = {k.lower(): k for k in KINDS} | {
    "group": "TaskGroup",
    "groups": "TaskGroup",
    "task-group": "TaskGroup",
    "task-groups": "TaskGroup",
    "tasks": "Task",
    "jobs": "Job",
    "queues": "Queue",
    "pools": "Pool",
}
SUFFIXES = (".yaml", ".yml", ".json")
TOP_LEVEL = frozenset({"apiVersion", "kind", "metadata", "spec"})


class Loader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML has no type stubs here
    """YAML 1.1 read with YAML 1.2's scalars: `on`, `off`, `yes` and `no` stay strings (a
    job's dependency says `on: prep`), only true/false are booleans, and `20:00` is a time
    of day, not the base-60 number 1200."""


_REPLACED = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}
Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _REPLACED]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?"
        r"|\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


class FileError(Exception):
    """A refusal of one document: where it is (file, document number, line) and the field."""

    def __init__(self, where: str, line: int | None, field_name: str, message: str) -> None:
        at = f"{where}, line {line}" if line else where
        super().__init__(f"{at}: {field_name}: {message}")
        self.where, self.line, self.field, self.message = where, line, field_name, message


@dataclass(frozen=True)
class Document:
    """One document of a file: its kind, name and spec, and the line of each field path
    (`("spec", "volumes", 0, "host_path")` -> 12)."""

    source: str
    index: int  # 1-based within its file
    kind: str
    name: str
    spec: dict[str, Any]
    lines: Mapping[tuple[Any, ...], int] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.source}, document {self.index} ({self.kind} {self.name!r})"

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.name}"

    def line_of(self, path: tuple[Any, ...]) -> int | None:
        """The line of `path`, or of its nearest ancestor the file has."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get(())

    def error(self, field_name: str, message: str) -> FileError:
        """A refusal of a spec field named the API's way (`volumes.0.host_path`)."""
        path: tuple[Any, ...] = ("spec",)
        for part in field_name.split(".") if field_name else ():
            path += (int(part) if part.isdigit() else part,)
        return FileError(self.where, self.line_of(path), f"spec.{field_name}", message)


def _marks(node: yaml.Node, path: tuple[Any, ...], out: dict[tuple[Any, ...], int]) -> None:
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else str(key)
            _marks(value, path + (name,), out)
            out[path + (name,)] = key.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _marks(item, path + (i,), out)


def parse_text(text: str, source: str) -> list[Document]:
    """Every document of one file's text (YAML, of which JSON is a subset)."""
    loader = Loader(text)
    docs: list[Document] = []
    index = 0
    try:
        while True:
            index += 1  # the document a syntax error is in: the one being read
            if not loader.check_node():
                break
            node = loader.get_node()
            data = loader.construct_document(node)
            if data is None:  # an empty document (a trailing `---`)
                continue
            lines: dict[tuple[Any, ...], int] = {}
            _marks(node, (), lines)
            docs.append(_document(data, source, index, lines))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise FileError(f"{source}, document {index}", line, "(syntax)", str(exc.problem)) from None
    finally:
        loader.dispose()
    return docs


def _document(data: Any, source: str, index: int, lines: dict[tuple[Any, ...], int]) -> Document:
    where = f"{source}, document {index}"

    def refuse(path: tuple[Any, ...], message: str) -> FileError:
        line = lines.get(path) or lines.get(path[:-1]) or lines.get(())
        return FileError(where, line, ".".join(str(p) for p in path) or "(document)", message)

    if not isinstance(data, dict):
        raise refuse((), "a document is a mapping with apiVersion, kind, metadata and spec")
    unknown = sorted(str(k) for k in data if k not in TOP_LEVEL)
    if unknown:
        raise refuse((unknown[0],), f"unknown field(s): {', '.join(unknown)}")
    if data.get("apiVersion") != API_VERSION:
        raise refuse(("apiVersion",), f"must be {API_VERSION!r}, got {data.get('apiVersion')!r}")
    kind = data.get("kind")
    if kind not in KINDS:
        raise refuse(("kind",), f"must be one of {', '.join(KINDS)}, got {kind!r}")
    meta = data.get("metadata")
    if not isinstance(meta, dict):
        raise refuse(("metadata",), "a mapping with name is required")
    extra = sorted(str(k) for k in meta if k != "name")
    if extra:
        raise refuse(("metadata", extra[0]), f"unknown field(s): {', '.join(extra)}")
    name = meta.get("name")
    if not isinstance(name, str) or not name.strip():
        raise refuse(("metadata", "name"), "a non-empty string is required")
    spec = data.get("spec", {})
    if not isinstance(spec, dict):
        raise refuse(("spec",), "must be a mapping")
    if "name" in spec and spec["name"] != name:
        raise refuse(("spec", "name"), f"differs from metadata.name ({name!r}): leave it out")
    return Document(source, index, kind, name, dict(spec), lines)


def files_of(paths: Iterable[str | Path]) -> list[Path]:
    """The files named, a directory's workload files (sorted, not recursive) in its place;
    `-` is standard input."""
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            out.extend(sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file()))
        else:
            out.append(path)
    return out


def load(paths: Iterable[str | Path]) -> list[Document]:
    """Every document of `paths` (files or directories), refusing the first bad one and two
    documents of one kind and name."""
    docs: list[Document] = []
    for path in files_of(paths):
        if str(path) == "-":
            docs.extend(parse_text(sys.stdin.read(), "<stdin>"))
            continue
        try:
            text = path.read_text()
        except OSError as exc:
            raise FileError(str(path), None, "(file)", exc.strerror or str(exc)) from None
        docs.extend(parse_text(text, str(path)))
    seen: dict[str, Document] = {}
    for doc in docs:
        if doc.ref in seen:
            first = seen[doc.ref]
            raise FileError(
                doc.where,
                doc.line_of(("metadata", "name")),
                "metadata.name",
                f"{doc.ref} is also {first.where}",
            )
        seen[doc.ref] = doc
    return docs
