"""Who may do what on NATS: the subject permissions of each platform user, as data.

Pure: builds the `permissions` maps that libs/embedded.py writes into the embedded server's
configuration (nats-server's own format), so a test can read them and an operator running an
external cluster can copy them.

* `heteroflow` (ADMIN): everything. `up` declares the streams and the lease bucket with it;
  the ops commands use it. Nobody else may administer streams.
* a service (`NatsUser`, declared by each service's `ServiceSpec`, listed in
  heteroflow/services.py): the JetStream API except stream administration; the subjects of
  `RESTRICTED` only where its user names them in `may_publish` (node commands: the
  scheduler; domain events: the outbox relay; the router's figures, the AutoScaler's input:
  the api-gateway); no service may publish as a node (reports, heartbeats, telemetry).
* an agent (`agent-<node_id>`, allow-list): publish its own report, heartbeat and telemetry
  subjects, create and read its own command consumer (the create subject names the filter,
  so the consumer cannot be pointed at another node's commands), pull from it and
  acknowledge; subscribe to its own log-request subject and to inboxes under its own prefix
  (`agent_inbox_prefix`), never to another client's inbox; answer the requests it receives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .subjects import EVENTS_PREFIX, NODE_PREFIX, NODE_STREAM, SERVING_PREFIX, escape_token

ADMIN = "heteroflow"

# Stream administration: create, change, delete, purge, edit messages, snapshot/restore,
# move leaders. Reads (INFO, NAMES, LIST, MSG.GET, DIRECT.GET) stay open to services.
STREAM_ADMIN: tuple[str, ...] = tuple(
    f"$JS.API.{op}"
    for op in (
        "STREAM.CREATE.>",
        "STREAM.UPDATE.>",
        "STREAM.DELETE.>",
        "STREAM.PURGE.>",
        "STREAM.MSG.DELETE.>",
        "STREAM.SNAPSHOT.>",
        "STREAM.RESTORE.>",
        "STREAM.LEADER.STEPDOWN.>",
        "STREAM.PEER.REMOVE.>",
        "ACCOUNT.PURGE.>",
        "META.LEADER.STEPDOWN",
        "SERVER.REMOVE",
    )
)
NODE_COMMANDS = f"{NODE_PREFIX}.*.cmd"
NODE_OWN_SUBJECTS = tuple(
    f"{NODE_PREFIX}.*.{kind}" for kind in ("report", "heartbeat", "telemetry")
)
EVENTS = f"{EVENTS_PREFIX}.>"
SERVING_METRICS = f"{SERVING_PREFIX}.*.metrics"
# Subjects a service may publish on only when its user names them.
RESTRICTED: tuple[str, ...] = (NODE_COMMANDS, EVENTS, SERVING_METRICS)


@dataclass(frozen=True)
class NatsUser:
    """A service's NATS user: its name and the `RESTRICTED` subjects it may publish on."""

    name: str
    may_publish: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.may_publish) - set(RESTRICTED)
        if unknown:
            raise ValueError(f"{self.name}: not a restricted subject: {sorted(unknown)}")


def nats_user(node_id: str) -> str:
    """The NATS user of a node's agent."""
    return f"agent-{node_id}"


def agent_durable(node_id: str) -> str:
    """The durable consumer of one node's commands."""
    return f"agent-{node_id}"


def agent_inbox_prefix(node_id: str) -> str:
    """The inbox prefix an agent's connection uses (the only inboxes it may subscribe to)."""
    return f"_INBOX_{escape_token(node_id)}"


def service_permissions(user: NatsUser) -> dict[str, Any]:
    deny = [*STREAM_ADMIN, *NODE_OWN_SUBJECTS]
    deny += [subject for subject in RESTRICTED if subject not in user.may_publish]
    return {"publish": {"deny": deny}}


def agent_permissions(node_id: str) -> dict[str, Any]:
    node = escape_token(node_id)
    durable = agent_durable(node_id)
    cmd = f"{NODE_PREFIX}.{node}.cmd"
    return {
        "publish": {
            "allow": [
                f"{NODE_PREFIX}.{node}.report",
                f"{NODE_PREFIX}.{node}.heartbeat",
                f"{NODE_PREFIX}.{node}.telemetry",
                f"$JS.API.CONSUMER.CREATE.{NODE_STREAM}.{durable}.{cmd}",
                f"$JS.API.CONSUMER.INFO.{NODE_STREAM}.{durable}",
                f"$JS.API.CONSUMER.MSG.NEXT.{NODE_STREAM}.{durable}",
                f"$JS.ACK.{NODE_STREAM}.{durable}.>",
            ]
        },
        "subscribe": {"allow": [f"{NODE_PREFIX}.{node}.logs", f"{agent_inbox_prefix(node_id)}.>"]},
        # Answers to the log requests it received, and to nothing else.
        "allow_responses": {"max": 1, "expires": "1m"},
    }
