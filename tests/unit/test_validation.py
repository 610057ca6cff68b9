"""The edge validators, table-driven: image references, mount points, JSON shape, limits."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from libs.domain.errors import DomainError
from libs.domain.task.model import TaskSpec, parse_create
from libs.domain.validation import (
    SPEC_MAX_BYTES,
    check_json_document,
    check_spec_size,
    image_reference_error,
    normalise_container_path,
)

GOOD_IMAGES = [
    "busybox",
    "busybox:latest",
    "library/busybox:1.36.1",
    "ghcr.io/acme/trainer:v2",
    "localhost/app",
    "localhost:5000/team/app:dev",
    "registry.example.com:443/a/b/c/d:1.0-rc_1",
    "Registry.Example.COM/app",  # the host part may use capitals
    "[::1]:5000/app:tag",
    "192.168.1.10:5000/app",
    "vllm/vllm-openai@sha256:" + "0123456789abcdef" * 4,
    "app:tag@sha256:" + "a" * 64,
    "a__b/c.d/e---f",
    "nvcr.io/nvidia/pytorch:24.01-py3",
]

BAD_IMAGES = [
    ("shell", "busybox;rm -rf / #"),
    ("space", "busybox latest"),
    ("pipe", "busybox|sh"),
    ("subshell", "$(reboot)"),
    ("uppercase repo", "library/BusyBox"),
    ("empty tag", "busybox:"),
    ("tag too long", "busybox:" + "t" * 129),
    ("tag starts with dot", "busybox:.x"),
    ("short digest", "busybox@sha256:abc"),
    ("digest not hex", "busybox@sha256:" + "g" * 64),
    ("leading slash", "/busybox"),
    ("trailing slash", "busybox/"),
    ("double slash", "a//b"),
    ("leading separator", "-busybox"),
    ("triple underscore", "a___b"),
    ("newline", "busybox\n"),
    ("NUL", "busybox\x00"),
    ("non-ascii", "büsybox"),
    ("name over 255", "a" * 256),
    ("over 512", "a/" * 300 + "a"),
]


@pytest.mark.parametrize("ref", GOOD_IMAGES)
def test_valid_image_references(ref: str) -> None:
    assert image_reference_error(ref) is None


@pytest.mark.parametrize(("ref"), [c[1] for c in BAD_IMAGES], ids=[c[0] for c in BAD_IMAGES])
def test_invalid_image_references(ref: str) -> None:
    assert image_reference_error(ref) is not None


@pytest.mark.parametrize(
    "ref",
    ["a" + "-" * 510 + "!", "a." * 255 + "!", ("a-a." * 127) + "-", "a" * 100 + "__" * 200 + "_"],
    ids=["dashes", "dots", "mixed", "underscores"],
)
def test_hostile_references_fail_fast(ref: str) -> None:
    started = time.perf_counter()
    assert image_reference_error(ref[:512]) is not None
    assert time.perf_counter() - started < 0.05  # no catastrophic backtracking


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/work", "/work"),
        ("/work/", "/work"),
        ("//work//data/./x", "/work/data/x"),
        ("/procfs", "/procfs"),
        ("/device", "/device"),
        ("/data/proc", "/data/proc"),
    ],
)
def test_mount_points_are_normalised(path: str, expected: str) -> None:
    assert normalise_container_path(path) == expected


@pytest.mark.parametrize(
    "path",
    ["/", "//", "/.", "/proc", "/proc/1", "//proc", "/./proc/", "/sys", "/sys/fs/cgroup", "/dev",
     "/dev/shm", "relative", "", "/a/../b", "/a\x00b", "/" + "a" * 1024],
)  # fmt: skip
def test_forbidden_mount_points(path: str) -> None:
    with pytest.raises(ValueError):
        normalise_container_path(path)


def nested(depth: int) -> Any:
    doc: Any = 1
    for _ in range(depth):
        doc = {"k": doc}
    return doc


def deep_list(depth: int) -> Any:
    doc: Any = 1
    for _ in range(depth):
        doc = [doc]
    return doc


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"labels": nested(32)}, "labels"),
        ({"a": deep_list(32)}, "a"),
        ({"name": "a\x00"}, "name"),
        ({"env": {"K\x00": "v"}}, "env.K\x00"),
        ({"volumes": [{"host_path": "/data\x00"}]}, "volumes.0.host_path"),
        ({"command": "\ud800"}, "command"),
        ({"labels": {"\udfff": "x"}}, "labels.\udfff"),
    ],
    ids=["deep map", "deep list", "NUL value", "NUL key", "NUL in list", "surrogate", "surr key"],
)
def test_json_documents_refused(doc: Any, field: str) -> None:
    with pytest.raises(DomainError) as info:
        check_json_document(doc, 32)
    assert info.value.fields == [field]


def test_json_documents_accepted() -> None:
    check_json_document({"labels": nested(30), "name": "ünïcode 😀", "n": [1, 2.5, None, True]})


def test_a_deep_document_does_not_recurse() -> None:
    with pytest.raises(DomainError):
        check_json_document(nested(100_000), 32)


def test_the_spec_size_backstop_names_the_largest_fields() -> None:
    # Astral characters: 4 bytes in UTF-8, 12 once ASCII-escaped as events carry them.
    env = {f"K{i}": "😀" * 8_000 for i in range(3)}
    with pytest.raises(DomainError) as info:
        parse_create({"name": "a", "image": "busybox", "env": env, "command": "😀" * 16_000},
                     tenant=True)  # fmt: skip
    assert str(SPEC_MAX_BYTES) in info.value.message
    assert info.value.fields[0] in ("env", "command")


@pytest.mark.parametrize("fill", ["\x7f", "é", "😀"])
def test_the_spec_size_check_refuses_exactly_where_the_encoded_size_passes_the_limit(
    fill: str,
) -> None:
    """The compact-size shortcut skips the exact count only far below the limit: around it
    a create is refused exactly when the spec's encoded size (`check_spec_size`) is over."""
    # Encoded characters per character: DEL is 1 byte compact and 6 escaped, the widest
    # ratio; printable ASCII cannot reach the limit (the per-field limits hold it far below).
    per = len(json.dumps(fill)) - 2
    verdicts = []
    for target in (SPEC_MAX_BYTES // 3 - 64, SPEC_MAX_BYTES - 4_000, SPEC_MAX_BYTES + 300):
        chars = target // per
        env = {f"K{i}": fill * min(8_000, chars - i) for i in range(0, chars, 8_000)}
        body = {"name": "a", "image": "busybox", "env": env}
        try:
            check_spec_size(TaskSpec.model_validate(body).model_dump(mode="json"))
            exact_ok = True
        except DomainError:
            exact_ok = False
        try:
            spec = parse_create(body, tenant=True)
        except DomainError as exc:
            assert not exact_ok and str(SPEC_MAX_BYTES) in exc.message, (fill, target)
        else:
            assert exact_ok and spec.env == env, (fill, target)
        verdicts.append(exact_ok)
    assert verdicts == [True, True, False], "both sides of the limit were tried"
