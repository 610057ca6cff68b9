"""First credentials of the multi-container deployment (deploy/compose.yaml) and its NATS logins.

Run once PostgreSQL is up and before the NATS servers start:

    python deploy/compose_bootstrap.py postgresql://heteroflow:PASSWORD@HOST:PORT/heteroflow

It creates the default tenant, an API key and an operator token (printed), issues each agent
of the compose file its node key, and writes next to this file

* `nats-auth.conf`: the NATS servers' users, the admin the services log in with and one user
  per agent, `agent-<node id>` with the bcrypt hash of its key and the permissions of
  libs/bus/permissions.py (only its own report/heartbeat subjects and command consumer), as
  `heteroflow up` gives the embedded server;
* `.env`: `HETEROFLOW_AGENT_<n>_KEY=...`, which Compose reads into the agents' environment.

Both files hold secrets (mode 0600) and are not committed. Running it again issues new node keys
(the old ones stop working at the next NATS start) and new API credentials.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from libs import auth
from libs.bus import permissions as perms
from libs.store import tenants
from libs.store.eventstore import EventStore

HERE = Path(__file__).resolve().parent
# The compose file's agents: service name -> node id (HETEROFLOW_NODE_ID).
AGENTS = {"agent-1": "compose-agent-1", "agent-2": "compose-agent-2", "agent-3": "compose-agent-3"}
ADMIN_PASSWORD = "change-me"  # as in the compose file's HETEROFLOW_NATS_URL


@dataclass
class Credentials:
    tenant_key: str = ""
    operator_token: str = ""
    agent_keys: dict[str, str] = field(default_factory=dict)  # service name -> key
    node_hashes: dict[str, str] = field(default_factory=dict)  # node id -> bcrypt hash


async def bootstrap(database_url: str, agents: dict[str, str] = AGENTS) -> Credentials:
    store = await EventStore.open(database_url, max_size=1)  # migrates, as every service does
    try:
        if await tenants.get_tenant(store, "default") is None:
            await auth.create_tenant(store, "default", "default")
        creds = Credentials()
        _, creds.tenant_key = await auth.issue_api_key(store, "default", "compose")
        creds.operator_token = await auth.issue_system_credential(store, "operator", "compose")
        for service, node_id in agents.items():
            creds.agent_keys[service] = await auth.issue_node_credential(store, node_id)
        logins = {n.node_id: n.nats_password_hash for n in await tenants.node_logins(store)}
        creds.node_hashes = {n: logins[n] for n in agents.values()}
        return creds
    finally:
        await store.close()


def nats_auth_config(node_hashes: dict[str, str], admin_password: str = ADMIN_PASSWORD) -> str:
    """An `authorization` block for nats-server (it reads JSON as its configuration syntax)."""
    users: list[dict[str, Any]] = [{"user": perms.ADMIN, "password": admin_password}]
    for node_id, bcrypt_hash in sorted(node_hashes.items()):
        users.append(
            {
                "user": perms.nats_user(node_id),
                "password": bcrypt_hash,
                "permissions": perms.agent_permissions(node_id),
            }
        )
    return f"authorization {{ users: {json.dumps(users, indent=2)} }}\n"


def env_name(service: str) -> str:
    """`agent-1` -> `HETEROFLOW_AGENT_1_KEY`, the variable the compose file reads."""
    return "HETEROFLOW_" + service.upper().replace("-", "_") + "_KEY"


def write(out: Path, creds: Credentials) -> None:
    def private(path: Path, text: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)

    out.mkdir(parents=True, exist_ok=True)
    private(out / "nats-auth.conf", nats_auth_config(creds.node_hashes))
    private(out / ".env", "".join(f"{env_name(s)}={k}\n" for s, k in creds.agent_keys.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("database_url", help="the deployment's PostgreSQL, as seen from here")
    parser.add_argument("--out", type=Path, default=HERE, help="where the two files go")
    args = parser.parse_args(argv)
    creds = asyncio.run(bootstrap(args.database_url))
    write(args.out, creds)
    print(f"wrote {args.out / 'nats-auth.conf'} and {args.out / '.env'}")
    print(f"tenant API key: {creds.tenant_key}\noperator token: {creds.operator_token}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
