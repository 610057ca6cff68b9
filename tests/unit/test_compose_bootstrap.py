"""deploy/compose_bootstrap.py: the NATS users of the compose deployment give each agent its
own login with only its own permissions, and the variable names match the compose file."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import yaml

from libs.bus import permissions as perms

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "compose_bootstrap", DEPLOY / "compose_bootstrap.py"
    )
    assert spec is not None and spec.loader is not None
    module = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


def test_each_agent_logs_in_as_its_own_user_with_its_own_permissions() -> None:
    conf = _script().nats_auth_config({"n2": "$2b$10$b", "n1": "$2b$10$a"}, "pw")
    users = json.loads(conf.removeprefix("authorization { users: ").removesuffix(" }\n"))
    assert users == [
        {"user": perms.ADMIN, "password": "pw"},
        {"user": "agent-n1", "password": "$2b$10$a", "permissions": perms.agent_permissions("n1")},
        {"user": "agent-n2", "password": "$2b$10$b", "permissions": perms.agent_permissions("n2")},
    ]


def test_the_compose_file_reads_the_keys_the_script_writes_for_its_agents() -> None:
    script = _script()
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    for service, node_id in script.AGENTS.items():
        env = services[service]["environment"]
        assert env["HETEROFLOW_NODE_ID"] == node_id
        assert env["HETEROFLOW_AGENT_TOKEN"] == "${" + script.env_name(service) + "}"
        assert "@" not in env["HETEROFLOW_NATS_URL"]  # no shared login in the agents' URL
