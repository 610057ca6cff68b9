"""Limits at the edge, over HTTP against a real PostgreSQL: body size (413), media type (415),
JSON depth, NUL, encoding, image references and mount points (400 naming the field)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from libs.domain import validation as v

from .helpers import Api

pytestmark = pytest.mark.integration

BASE = {"name": "edge", "image": "busybox:latest"}
JSON = {"content-type": "application/json"}
MiB = 1024 * 1024


async def post_raw(api: Api, raw: bytes | Any, headers: dict[str, str] | None = None) -> Any:
    return await api.client.post(
        "/api/v1/tasks", content=raw, headers=api.tenant | (JSON if headers is None else headers)
    )


def refused(r: Any, status: int, code: int, field: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == code and field in body.get("fields", []), body


async def test_a_10_mib_body_is_413_and_the_next_create_is_served(api: Api) -> None:
    big = json.dumps(BASE | {"command": "x" * (10 * MiB)}).encode()
    refused(await post_raw(api, big), 413, 41301, "body")
    r = await api.client.post("/api/v1/tasks", json=BASE, headers=api.other_tenant)
    assert r.status_code == 201, r.text


async def test_a_chunked_body_over_the_limit_is_413_without_reading_it_all(api: Api) -> None:
    sent = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal sent
        yield b'{"name": "edge", "image": "busybox", "command": "'
        for _ in range(10 * 16):  # 10 MiB in 64 KiB chunks, no Content-Length
            sent += 64 * 1024
            yield b"x" * (64 * 1024)
        yield b'"}'

    r = await post_raw(api, chunks())
    refused(r, 413, 41301, "body")
    assert sent <= api.settings.max_body_bytes + 64 * 1024  # stopped at the limit


async def test_a_body_at_the_limit_is_read(api: Api) -> None:
    # Just under 1 MiB: passes the size check, then the per-field limit names `command`.
    raw = json.dumps(BASE | {"command": "x" * (MiB - 100)}).encode()
    assert len(raw) <= api.settings.max_body_bytes
    refused(await post_raw(api, raw), 400, 40003, "command")


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin-1"],
    ids=["missing", "text", "form", "latin-1"],
)
async def test_only_json_bodies_are_accepted(api: Api, content_type: str | None) -> None:
    headers = {} if content_type is None else {"content-type": content_type}
    refused(await post_raw(api, json.dumps(BASE).encode(), headers), 415, 41501, "content-type")


async def test_json_with_a_charset_is_accepted(api: Api) -> None:
    headers = {"content-type": "application/json; charset=UTF-8"}
    assert (await post_raw(api, json.dumps(BASE).encode(), headers)).status_code == 201


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"name": "a", "image": "busybox", "labels": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
         "body"),
        (b'{"name": "a", "image": "busybox", "labels": ' + b'{"a":' * 40 + b"1" + b"}" * 41,
         "labels"),
        (b'{"name": "a\\u0000b", "image": "busybox"}', "name"),
        (b'{"name": "a", "image": "busybox", "env": {"K\\u0000": "v"}}', "env.K\x00"),
        (b'{"name": "a", "image": "busybox", "command": "\\ud800"}', "command"),
        (b'{"name": "a", "image": "busybox", "command": "\xff\xfe"}', "body"),
    ],
    ids=["10000 deep", "41 deep", "NUL in name", "NUL in env key", "lone surrogate", "bad utf8"],
)  # fmt: skip
async def test_hostile_json_is_400_naming_the_field(api: Api, raw: bytes, field: str) -> None:
    refused(await post_raw(api, raw), 400, 40003, field)


async def test_nul_in_the_url_is_400(api: Api) -> None:
    r = await api.client.get("/api/v1/tasks?name=a%00b", headers=api.tenant)
    refused(r, 400, 40003, "url")
    r = await api.client.get("/api/v1/tasks/abc%00def", headers=api.tenant)
    refused(r, 400, 40003, "url")


VOLUME = {"host_path": "/data/x", "container_path": "/work"}
MOUNT = "volumes.0.container_path"

REFUSED = [
    ("shell in image", {"image": "busybox; rm -rf / #"}, "image"),
    ("uppercase image", {"image": "BusyBox"}, "image"),
    ("space in image", {"image": "busybox latest"}, "image"),
    ("bad digest", {"image": "busybox@sha256:xyz"}, "image"),
    ("proc mount", {"volumes": [VOLUME | {"container_path": "/proc"}]}, MOUNT),
    ("below sys", {"volumes": [VOLUME | {"container_path": "/sys/fs"}]}, MOUNT),
    ("root mount", {"volumes": [VOLUME | {"container_path": "//"}]}, MOUNT),
    ("dev via //", {"volumes": [VOLUME | {"container_path": "//dev"}]}, MOUNT),
    ("dotdot", {"volumes": [VOLUME | {"container_path": "/a/../proc"}]}, MOUNT),
    ("relative", {"volumes": [VOLUME | {"container_path": "work"}]}, MOUNT),
    ("twice", {"volumes": [VOLUME, VOLUME | {"container_path": "/work/"}]},
     "volumes.1.container_path"),
    ("long command", {"command": "x" * (v.COMMAND_MAX + 1)}, "command"),
    ("many env", {"env": {f"K{i}": "v" for i in range(v.ENV_MAX_ENTRIES + 1)}}, "env"),
    ("long env value", {"env": {"K": "v" * (v.ENV_VALUE_MAX + 1)}}, "env.K"),
    ("many labels", {"labels": {f"k{i}": "v" for i in range(v.LABELS_MAX_ENTRIES + 1)}}, "labels"),
    ("long label", {"labels": {"k": "v" * (v.LABEL_VALUE_MAX + 1)}}, "labels.k"),
    ("long name", {"name": "n" * 101}, "name"),
    ("many volumes", {"volumes": [VOLUME | {"container_path": f"/w{i}"} for i in range(33)]},
     "volumes"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "field"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
async def test_limits_are_400_naming_the_field(api: Api, extra: dict[str, Any], field: str) -> None:
    r = await api.client.post("/api/v1/tasks", json=BASE | extra, headers=api.tenant)
    refused(r, 400, 40003, field)


async def test_a_refused_update_names_the_field_and_changes_nothing(api: Api) -> None:
    created = (await api.client.post("/api/v1/tasks", json=BASE, headers=api.tenant)).json()
    url = f"/api/v1/tasks/{created['id']}"
    r = await api.client.put(url, json={"image": "a b"}, headers=api.tenant)
    refused(r, 400, 40003, "image")
    r = await api.client.put(url, content=b'{"command": "x"}', headers=api.tenant)
    refused(r, 415, 41501, "content-type")
    assert (await api.client.get(url, headers=api.tenant)).json()["image"] == BASE["image"]


async def test_accepted_references_and_mount_points(api: Api) -> None:
    body = BASE | {
        "image": "registry.example.com:5000/team/trainer_v2:1.0-rc1@sha256:" + "a" * 64,
        "volumes": [VOLUME | {"container_path": "//work/./data/"}],
    }
    r = await api.client.post("/api/v1/tasks", json=body, headers=api.tenant)
    assert r.status_code == 201, r.text
    assert r.json()["volumes"][0]["container_path"] == "/work/data"


async def test_the_group_template_is_checked_too(api: Api) -> None:
    body = BASE | {"task_count": 2, "image": "busybox|sh"}
    r = await api.client.post("/api/v1/task-groups", json=body, headers=api.tenant)
    refused(r, 400, 40003, "image")


async def test_a_report_with_an_oversized_result_is_400(api: Api) -> None:
    created = (await api.client.post("/api/v1/tasks", json=BASE, headers=api.tenant)).json()
    await api.place(created["id"])
    body = {"status": "failed", "result": "r" * (v.REPORT_TEXT_MAX + 1)}
    r = await api.client.put(f"/api/v1/tasks/{created['id']}", json=body, headers=api.agent)
    refused(r, 400, 40003, "result")
