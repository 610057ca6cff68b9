"""Who may do what on NATS: the subject permissions of each platform user, as data.

Pure: builds the `permissions` maps that libs/embedded.py writes into the embedded server's
configuration (nats-server's own format), so a test can read them and an operator running an
external cluster can copy them.

* `heteroflow` (ADMIN): everything. `up` declares the streams and the lease bucket with it;
  the ops commands use it. Nobody else may administer streams.
* services (`SERVICE_USERS`): the JetStream API except stream administration; only
  `scheduler` may publish node commands, only `outbox-relay` domain events, only
  `api-gateway` the router's figures (the AutoScaler's input, read by `autoscaler`); no
  service may publish as a node (reports, heartbeats, telemetry).
* an agent (`agent-<node_id>`, allow-list): publish its own report, heartbeat and telemetry
  subjects, create and read its own command consumer (the create subject names the filter,
  so the consumer cannot be pointed at another node's commands), pull from it and
  acknowledge; subscribe to its own log-request subject and to inboxes under its own prefix
  (`agent_inbox_prefix`), never to another client's inbox; answer the requests it receives.
"""

from __future__ import annotations

from typing import Any

from .subjects import EVENTS_PREFIX, NODE_PREFIX, NODE_STREAM, SERVING_PREFIX, escape_token

ADMIN = "heteroflow"
GATEWAY = "api-gateway"
RELAY = "outbox-relay"
SCHEDULER = "scheduler"
SERVICE_USERS: tuple[str, ...] = (
    GATEWAY,
    RELAY,
    SCHEDULER,
    "retry-engine",
    "event-timeline",
    "job-orchestrator",
    "autoscaler",
    "rollout",
)

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


def nats_user(node_id: str) -> str:
    """The NATS user of a node's agent."""
    return f"agent-{node_id}"


def agent_durable(node_id: str) -> str:
    """The durable consumer of one node's commands."""
    return f"agent-{node_id}"


def agent_inbox_prefix(node_id: str) -> str:
    """The inbox prefix an agent's connection uses (the only inboxes it may subscribe to)."""
    return f"_INBOX_{escape_token(node_id)}"


def service_permissions(user: str) -> dict[str, Any]:
    deny = [*STREAM_ADMIN, *NODE_OWN_SUBJECTS]
    if user != SCHEDULER:
        deny.append(NODE_COMMANDS)
    if user != RELAY:
        deny.append(EVENTS)
    if user != GATEWAY:
        deny.append(SERVING_METRICS)
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
