"""Volume host paths: the per-tenant allow-list (libs/domain/task/model.py) and the agent's
resolution of each path on its host (agent/recheck.py), on a real directory tree."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agent.recheck import checked, resolve_host_path
from agent.runtimes.base import RunSpec
from agent.settings import AgentSettings
from libs.config import GatewaySettings
from libs.domain.errors import DomainError
from libs.domain.task.model import (
    allow_list_entry_error,
    host_path_allowed,
    parse_create,
    tenant_allow_list,
)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """<root>/acme (the tenant's own), <root>/globex/set/secret (another tenant's)."""
    (tmp_path / "acme" / "real").mkdir(parents=True)
    (tmp_path / "acme" / "real" / "in.txt").write_text("mine\n")
    (tmp_path / "globex" / "set").mkdir(parents=True)
    (tmp_path / "globex" / "set" / "secret").write_text("theirs\n")
    return tmp_path


def run(tree: Path, host: str, tenant: str = "acme") -> RunSpec:
    return RunSpec.model_validate(
        {
            "task_id": "t1",
            "attempt": 0,
            "image": "busybox",
            "tenant_id": tenant,
            "volumes": [{"host_path": host, "container_path": "/work"}],
        }
    )


def allow(tree: Path) -> list[str]:
    return [f"{tree}/{{tenant}}"]


# -- the allow-list forms ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("entries", "tenant", "want"),
    [
        (["/data"], "acme", ["/data"]),
        (["/data/{tenant}"], "acme", ["/data/acme"]),
        (["/data/{tenant}/in"], "globex", ["/data/globex/in"]),
        (["acme=/srv/shared", "/data"], "acme", ["/srv/shared", "/data"]),
        (["acme=/srv/shared", "/data"], "globex", ["/data"]),
        (["/data/{tenant}", "acme=/srv/x"], "", []),
        (["/data/{tenant}"], "../etc", []),
        (["data", "/ok"], "acme", ["/ok"]),
    ],
    ids=[
        "plain",
        "placeholder",
        "placeholder-inside",
        "scoped",
        "scoped-other",
        "no-tenant",
        "path-like-tenant",
        "malformed-skipped",
    ],
)
def test_tenant_allow_list(entries: list[str], tenant: str, want: list[str]) -> None:
    assert tenant_allow_list(entries, tenant) == want


def test_an_unscoped_placeholder_entry_allows_nothing_by_its_text() -> None:
    assert not host_path_allowed("/data/{tenant}/x", ["/data/{tenant}"])
    assert not host_path_allowed("/srv/x", ["acme=/srv"])


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("/data", None),
        ("/data/{tenant}", None),
        ("acme=/data", None),
        ("data", "neither /prefix"),
        ("acme=data", "neither /prefix"),
        ("/data/{user}", "only placeholder"),
        ("/data/../etc", "'..'"),
    ],
)
def test_allow_list_entries(entry: str, why: str | None) -> None:
    got = allow_list_entry_error(entry)
    assert (got is None) if why is None else (got is not None and why in got)


def test_settings_refuse_a_malformed_entry_naming_it() -> None:
    for settings in (GatewaySettings, AgentSettings):
        with pytest.raises(ValidationError, match="/data/{user}"):
            settings(volume_allow_list=["/data/{user}"])


def test_the_default_keeps_tenants_in_their_own_directories() -> None:
    listed = GatewaySettings().volume_allow_list
    assert listed == AgentSettings().volume_allow_list
    mine = tenant_allow_list(listed, "acme")
    assert host_path_allowed("/data/acme/set", mine)
    assert not host_path_allowed("/data/globex/set", mine)
    assert not host_path_allowed("/data", mine)


def test_the_gateway_refuses_another_tenants_directory_naming_the_volume() -> None:
    body: dict[str, Any] = {
        "name": "t",
        "image": "busybox",
        "volumes": [
            {"host_path": "/data/acme/in", "container_path": "/in"},
            {"host_path": "/data/globex/set", "container_path": "/set"},
        ],
    }
    scoped = tenant_allow_list(["/data/{tenant}"], "acme")
    with pytest.raises(DomainError) as err:
        parse_create(body, tenant=True, volume_allow_list=scoped)
    assert err.value.fields == ["volumes.1.host_path"]
    assert "/data/globex/set" in err.value.message and "/data/acme" in err.value.message
    theirs = tenant_allow_list(["/data/{tenant}"], "globex")
    with pytest.raises(DomainError) as err:
        parse_create(body, tenant=True, volume_allow_list=theirs)
    assert err.value.fields == ["volumes.0.host_path"]


# -- resolution on the host ---------------------------------------------------------------


def test_a_plain_directory_resolves_to_itself(tree: Path) -> None:
    real, why = resolve_host_path(f"{tree}/acme/real", [f"{tree}/acme"])
    assert why is None and real == f"{tree}/acme/real"


def test_a_planted_symlink_to_the_host_root_is_refused_naming_the_volume(tree: Path) -> None:
    os.symlink("/", tree / "acme" / "hostroot")
    got, why = checked(run(tree, f"{tree}/acme/hostroot"), allow(tree))
    assert why is not None
    assert why.startswith(f"volumes[0].host_path '{tree}/acme/hostroot' for tenant acme")
    assert "resolves to '/'" in why


def test_a_symlinked_parent_directory_is_refused(tree: Path) -> None:
    os.symlink("/etc", tree / "acme" / "up")
    _, why = checked(run(tree, f"{tree}/acme/up/passwd"), allow(tree))
    assert why is not None and "resolves to '/etc/passwd'" in why


def test_a_dangling_symlink_is_followed_too(tree: Path) -> None:
    # Docker would create the target if it is missing: the target counts, not the link.
    os.symlink("/etc/hf-not-there", tree / "acme" / "later")
    _, why = checked(run(tree, f"{tree}/acme/later"), allow(tree))
    assert why is not None and "/etc/hf-not-there" in why


def test_dotdot_is_refused_by_its_text_before_any_lookup(tree: Path) -> None:
    _, why = checked(run(tree, f"{tree}/acme/../globex/set"), allow(tree))
    assert why is not None and "is not under this node's allow-list" in why


def test_a_symlink_into_another_tenants_directory_is_refused(tree: Path) -> None:
    os.symlink(tree / "globex" / "set", tree / "acme" / "theirs")
    _, why = checked(run(tree, f"{tree}/acme/theirs"), allow(tree))
    assert why is not None and f"resolves to '{tree}/globex/set'" in why


def test_another_tenants_directory_is_refused_by_the_agent(tree: Path) -> None:
    _, why = checked(run(tree, f"{tree}/globex/set"), allow(tree))
    assert why is not None and f"({tree}/acme)" in why
    # ... and is that tenant's own.
    _, why = checked(run(tree, f"{tree}/globex/set", tenant="globex"), allow(tree))
    assert why is None


def test_the_runtime_is_given_the_resolved_path(tree: Path) -> None:
    os.symlink(tree / "acme" / "real", tree / "acme" / "alias")
    got, why = checked(run(tree, f"{tree}/acme/./alias/"), allow(tree))
    assert why is None
    assert [v.host_path for v in got.volumes] == [f"{tree}/acme/real"]


def test_a_prefix_that_is_itself_a_symlink_is_the_operators_choice(tree: Path) -> None:
    os.symlink(tree / "acme", tree / "acme-link")
    got, why = checked(run(tree, f"{tree}/acme-link/real"), [f"{tree}/{{tenant}}-link"])
    assert why is None and got.volumes[0].host_path == f"{tree}/acme/real"


def test_a_path_not_there_yet_is_left_to_the_runtime(tree: Path) -> None:
    got, why = checked(run(tree, f"{tree}/acme/new/dir"), allow(tree))
    assert why is None and got.volumes[0].host_path == f"{tree}/acme/new/dir"


@pytest.mark.parametrize(
    ("path", "documented", "for_acme"),
    [
        ("/data/acme/x", True, True),
        ("/data/globex/x", True, False),  # the document is every caller's: 400 for acme
        ("/srv/x", True, True),
        ("/data", False, False),
        ("/data/{tenant}/x", False, False),
        ("/srvx", False, False),
    ],
)
def test_the_documents_pattern_covers_every_tenants_part(
    path: str, documented: bool, for_acme: bool
) -> None:
    import re

    from services.api_gateway.request_docs import host_path_pattern

    entries = ["/data/{tenant}", "acme=/srv"]
    assert bool(re.fullmatch(host_path_pattern(entries), path)) is documented
    assert host_path_allowed(path, tenant_allow_list(entries, "acme")) is for_acme
