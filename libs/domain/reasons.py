"""Reason codes: why a status changed, or why a task still waits, as data.

One enum for the whole platform. Status-change events carry a `ReasonCode` next to their
free text (the text is for people, the code for programs); the scheduler's "why pending"
answers are codes of the same enum; metric labels and API fields use the values. No
consumer parses the text.

Events written before codes existed carry only text: `legacy_reason_code` maps such a
payload to a code once, when it is loaded (see `upcast_reason`), and is the only place that
reads reason prose.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any


class ReasonCode(StrEnum):
    # A stored event whose legacy text no rule recognises.
    UNSPECIFIED = "unspecified"
    # --- task status changes ------------------------------------------------------------
    SUBMITTED = "submitted"
    PLACED = "placed"
    STARTED = "started"
    RESUMED = "resumed"
    EXITED = "exited"
    START_FAILED = "start_failed"
    CONTAINER_LOST = "container_lost"
    LIVENESS_LOST = "liveness_lost"
    TIMEOUT = "timeout"
    REPORTED = "reported"
    USER_STOP = "user_stop"
    USER_DELETE = "user_delete"
    USER_SLEEP = "user_sleep"
    USER_WAKE = "user_wake"
    HOST_OFFLINE_ON_WAKE = "host_offline_on_wake"
    IDLE_SLEEP = "idle_sleep"
    REQUEST_WAKE = "request_wake"
    CARD_BORROWED = "card_borrowed"
    WAKE_QUEUED = "wake_queued"
    LENT_CARD_RETURNED = "lent_card_returned"
    PREEMPTED = "preempted"
    NODE_LOST = "node_lost"
    TASK_UNCONFIRMED = "task_unconfirmed"
    RETRY = "retry"
    RETRY_GIVEN_UP = "retry_given_up"
    GROUP_FAILED = "group_failed"
    ROLLOUT_DRAIN = "rollout_drain"
    ROLLOUT_REPLACED = "rollout_replaced"
    ROLLOUT_STOPPED = "rollout_stopped"
    # --- group events -------------------------------------------------------------------
    MEMBER_FAILED = "member_failed"
    MEMBERS_CHANGED = "members_changed"
    REBUILDS_EXHAUSTED = "rebuilds_exhausted"
    CRASH_LOOP = "crash_loop"
    GROUP_RESTART = "group_restart"
    GROUP_REBUILD = "group_rebuild"
    USER_SCALE = "user_scale"
    SCALED_DOWN = "scaled_down"
    SCHEDULE_WINDOW = "schedule_window"
    AUTOSCALE = "autoscale"
    ROLLOUT_ACTION = "rollout_action"
    ROLLOUT_BATCH_FAILED = "rollout_batch_failed"
    ROLLOUT_HOLDER_LOST = "rollout_holder_lost"
    ROLLOUT_COMPLETED = "rollout_completed"
    ROLLOUT_ROLLED_BACK = "rollout_rolled_back"
    # --- node events --------------------------------------------------------------------
    NODE_GONE = "node_gone"
    GPU_LOST = "gpu_lost"
    GPU_RECOVERED = "gpu_recovered"
    CARD_QUARANTINED = "card_quarantined"
    CARD_RESTORED = "card_restored"
    DEVICE_REQUEUE = "device_requeue"
    # --- why pending: the scheduler's rejections (task-level, then node stages) ----------
    NO_NODES = "no_nodes"
    BACKOFF = "backoff"
    TENANT_QUOTA_EXCEEDED = "tenant_quota_exceeded"
    QUEUE_QUOTA_EXCEEDED = "queue_quota_exceeded"
    POOL_CAPACITY = "pool_capacity"
    GANG_INCOMPLETE = "gang_incomplete"
    PINNED_ELSEWHERE = "pinned_elsewhere"
    NODE_OFFLINE = "node_offline"
    NODE_EXCLUDED = "node_excluded"
    NOT_IN_POOL = "not_in_pool"
    RUNTIME_UNAVAILABLE = "runtime_unavailable"
    GPU_TYPE_UNAVAILABLE = "gpu_type_unavailable"
    INSUFFICIENT_VRAM = "insufficient_vram"
    INSUFFICIENT_GPUS = "insufficient_gpus"
    FRACTION_UNAVAILABLE = "fraction_unavailable"
    INSUFFICIENT_MEMORY = "insufficient_memory"
    INSUFFICIENT_CPU = "insufficient_cpu"
    ANTI_AFFINITY = "anti_affinity"
    STARTS_IN_FLIGHT = "starts_in_flight"
    PORT_TAKEN = "port_taken"
    LOOPBACK_ADDRESS = "loopback_address"

    @property
    def text(self) -> str:
        """A short sentence for people."""
        return TEXT[self]


R = ReasonCode

TEXT: dict[ReasonCode, str] = {
    R.UNSPECIFIED: "no reason recorded",
    R.SUBMITTED: "submitted",
    R.PLACED: "placed on a node by the scheduler",
    R.STARTED: "the agent started the container",
    R.RESUMED: "the agent resumed the container",
    R.EXITED: "the container exited",
    R.START_FAILED: "the agent could not start the container",
    R.CONTAINER_LOST: "the agent no longer finds the container",
    R.LIVENESS_LOST: "no positive liveness past the floor and several signals of death",
    R.TIMEOUT: "the task exceeded its timeout",
    R.REPORTED: "status reported over the API",
    R.USER_STOP: "stop requested",
    R.USER_DELETE: "deleted",
    R.USER_SLEEP: "sleep requested",
    R.USER_WAKE: "wake requested",
    R.HOST_OFFLINE_ON_WAKE: "woken while its host was offline: rescheduled elsewhere",
    R.IDLE_SLEEP: "no request for its idle timeout: put to sleep",
    R.REQUEST_WAKE: "a request arrived while it slept: woken",
    R.CARD_BORROWED: "placed on the card of a sleeping task of its tenant (lent)",
    R.WAKE_QUEUED: "wake queued: its card is lent to a training task of its tenant",
    R.LENT_CARD_RETURNED: "its lent card came back (the borrower ended): the queued wake runs",
    R.PREEMPTED: "preempted by higher-priority work",
    R.NODE_LOST: "its node stopped sending heartbeats",
    R.TASK_UNCONFIRMED: "its node stopped listing it in its heartbeats",
    R.RETRY: "the retry engine requeued it",
    R.RETRY_GIVEN_UP: "the retry engine gave up: no retry left or a permanent failure",
    R.GROUP_FAILED: "its group failed",
    R.ROLLOUT_DRAIN: "replaced by a newer generation in a rolling update: draining",
    R.ROLLOUT_REPLACED: "replaced by a newer generation in a rolling update: drained, cancelled",
    R.ROLLOUT_STOPPED: "a new-generation replica stopped by a failed batch or a rollback",
    R.MEMBER_FAILED: "a member failed",
    R.MEMBERS_CHANGED: "the members' statuses changed",
    R.REBUILDS_EXHAUSTED: "no live replica and every rebuild used",
    R.CRASH_LOOP: "a replica kept failing: its restarts are used up",
    R.GROUP_RESTART: "whole-group restart after a start-up infrastructure failure",
    R.GROUP_REBUILD: "no live replica: the group is rebuilt",
    R.USER_SCALE: "replica count changed on request",
    R.SCALED_DOWN: "its rank was removed by a scale-down",
    R.SCHEDULE_WINDOW: "the group's schedule window opened or closed",
    R.AUTOSCALE: "the AutoScaler changed the replica count or ended an overdue drain",
    R.ROLLOUT_ACTION: "pause, resume or rollback of a rollout requested",
    R.ROLLOUT_BATCH_FAILED: "a rollout batch failed every attempt: rolled back",
    R.ROLLOUT_HOLDER_LOST: "the rollout's holder stopped renewing its lease",
    R.ROLLOUT_COMPLETED: "every replica runs the new generation",
    R.ROLLOUT_ROLLED_BACK: "the previous configuration serves again",
    R.NODE_GONE: "the node is gone for good",
    R.GPU_LOST: "a card disappeared from the heartbeats",
    R.GPU_RECOVERED: "a lost card is seen again",
    R.CARD_QUARANTINED: "a device fault took the card out of placement",
    R.CARD_RESTORED: "a quarantined card passed its health probes (or an operator returned it)",
    R.DEVICE_REQUEUE: "the card failed, not the task: requeued without spending a retry",
    R.NO_NODES: "no node is registered",
    R.BACKOFF: "waiting for the retry back-off",
    R.TENANT_QUOTA_EXCEEDED: "the tenant's GPU quota is used up",
    R.QUEUE_QUOTA_EXCEEDED: "the queue's quota is used up",
    R.POOL_CAPACITY: "the nodes of the queue's pools are full",
    R.GANG_INCOMPLETE: "not every member of the gang fits yet",
    R.PINNED_ELSEWHERE: "pinned to another node",
    R.NODE_OFFLINE: "the node is offline",
    R.NODE_EXCLUDED: "the node is excluded for this attempt",
    R.NOT_IN_POOL: "the node is in none of the queue's pools",
    R.RUNTIME_UNAVAILABLE: "the node's runtime cannot run it (a task without image needs a "
    "process node)",
    R.GPU_TYPE_UNAVAILABLE: "no card of the requested type",
    R.INSUFFICIENT_VRAM: "no card with enough memory",
    R.INSUFFICIENT_GPUS: "not enough free cards",
    R.FRACTION_UNAVAILABLE: "no card with a free fraction of that size",
    R.INSUFFICIENT_MEMORY: "not enough free memory",
    R.INSUFFICIENT_CPU: "not enough free CPU",
    R.ANTI_AFFINITY: "would share a node with a task it must avoid",
    R.STARTS_IN_FLIGHT: "the node is already starting as many tasks as the scheduler allows",
    R.PORT_TAKEN: "the pinned port is held on the node's host, or the host's port range is used up",
    R.LOOPBACK_ADDRESS: "the group spans hosts and a node advertises only a loopback address",
}

# Why a task still waits (the scheduler's feasibility answers), in the enum's order.
PLACEMENT_REASONS: tuple[ReasonCode, ...] = (
    R.NO_NODES,
    R.BACKOFF,
    R.TENANT_QUOTA_EXCEEDED,
    R.QUEUE_QUOTA_EXCEEDED,
    R.POOL_CAPACITY,
    R.GANG_INCOMPLETE,
    R.PINNED_ELSEWHERE,
    R.NODE_OFFLINE,
    R.NODE_EXCLUDED,
    R.NOT_IN_POOL,
    R.RUNTIME_UNAVAILABLE,
    R.GPU_TYPE_UNAVAILABLE,
    R.INSUFFICIENT_VRAM,
    R.INSUFFICIENT_GPUS,
    R.FRACTION_UNAVAILABLE,
    R.INSUFFICIENT_MEMORY,
    R.INSUFFICIENT_CPU,
    R.ANTI_AFFINITY,
    R.STARTS_IN_FLIGHT,
    R.PORT_TAKEN,
    R.LOOPBACK_ADDRESS,
)

# Failures caused by the infrastructure, not the user's program.
INFRASTRUCTURE_REASONS: frozenset[ReasonCode] = frozenset(
    {R.NODE_LOST, R.CONTAINER_LOST, R.LIVENESS_LOST}
)

# The version of the payloads that carry a code; version 1 carried only the text.
REASON_SCHEMA_VERSION = 2

# What an agent saw (a protocol `Fact` value) → the code; every other exit is EXITED.
_FACTS = {
    "starting": R.STARTED,
    "running": R.STARTED,
    "resumed": R.RESUMED,
    "start_failed": R.START_FAILED,
}


def report_reason(fact: str, from_status: str, to_status: str, error_kind: str = "") -> ReasonCode:
    """The code of a transition an agent report causes (`fact` is a protocol `Fact` value)."""
    if from_status == "preempting" and to_status == "pending":
        return R.PREEMPTED
    if fact == "lost":
        return R.CONTAINER_LOST
    if error_kind == "Timeout":
        return R.TIMEOUT
    return _FACTS.get(fact, R.EXITED)


# Exact texts version-1 producers wrote for task transitions.
_TASK_TEXTS = {
    "placed": R.PLACED,
    "wake: host offline": R.HOST_OFFLINE_ON_WAKE,
    "wake requested": R.USER_WAKE,
    "group wake": R.USER_WAKE,
    "stop requested": R.USER_STOP,
    "deleted": R.USER_DELETE,
    "sleep requested": R.USER_SLEEP,
    "group failed": R.GROUP_FAILED,
    "reported": R.REPORTED,
}
_RECOVERY_KINDS = {
    "group_restart": R.GROUP_RESTART,
    "restart_scheduled": R.GROUP_RESTART,
    "inference_rebuild": R.GROUP_REBUILD,
    "replica_replaced": R.MEMBER_FAILED,
}


def legacy_reason_code(event_type: str, payload: Mapping[str, Any]) -> ReasonCode:
    """The code of a version-1 payload, from the text and fields its producer wrote.

    It reads the stored JSON, not a model: it runs before validation (`upcast_reason`), and
    is what lets a version-1 payload validate at all. A consumer reads the parsed model's
    `reason_code` instead.
    """
    text = str(payload.get("reason") or "")
    if event_type == "task_status_changed":
        return _legacy_task(text, payload)
    if event_type == "task_pending_reason":
        head = text.partition(":")[0]
        return R(head) if head in PLACEMENT_REASONS else R.UNSPECIFIED
    if event_type == "group_status_changed":
        if text.startswith("member rank"):
            return R.MEMBER_FAILED
        if text.startswith("no live replica"):
            return R.REBUILDS_EXHAUSTED
        return R.MEMBERS_CHANGED if text.startswith("members are") else R.UNSPECIFIED
    if event_type == "group_recovery":
        return _RECOVERY_KINDS.get(str(payload.get("kind")), R.UNSPECIFIED)
    if event_type == "node_offline":
        return R.NODE_GONE if payload.get("gone") else R.NODE_LOST
    return R.UNSPECIFIED


def _legacy_task(text: str, p: Mapping[str, Any]) -> ReasonCode:
    src, to = str(p.get("from_status")), str(p.get("to_status"))
    if text.startswith("node_lost"):
        return R.NODE_LOST
    if text.startswith("preempted by"):
        return R.PREEMPTED
    if text.startswith("agent: "):
        return report_reason(text.removeprefix("agent: "), src, to, str(p.get("error_kind") or ""))
    if src == "failed" and to == "pending":
        return R.RETRY  # only the retry engine makes this transition
    return _TASK_TEXTS.get(text, R.UNSPECIFIED)


def upcast_reason(event_type: str, data: Any) -> Any:
    """A version-1 payload as version 2: the code derived once, at load time.

    Only data that says it is version 1 is upcast, so a producer that forgets the code
    fails validation instead of being guessed for.
    """
    if (
        isinstance(data, dict)
        and "reason_code" not in data
        and data.get("schema_version", REASON_SCHEMA_VERSION) < REASON_SCHEMA_VERSION
    ):
        code = legacy_reason_code(event_type, data)
        return {**data, "reason_code": code, "schema_version": REASON_SCHEMA_VERSION}
    return data
