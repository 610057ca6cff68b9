"""Messages between the control plane and node agents, and how reports become transitions.

Commands go to `hf.node.<id>.cmd`; reports and registration come back on
`hf.node.<id>.report`; heartbeats on `hf.node.<id>.heartbeat`. Every message is a versioned,
frozen model. An agent reports what it saw together with the status it believes the task has
(`expected_status`); `decide_report` turns that into one compare-and-set transition.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, field_validator, model_validator

from libs.domain.errors import Conflict
from libs.domain.node.model import NodeInventory
from libs.domain.reasons import report_reason
from libs.domain.task.decide import decide_transition
from libs.domain.task.events import TaskStatusChanged
from libs.domain.task.evolve import evolve_task
from libs.domain.task.failure import ErrorKind
from libs.domain.task.liveness import TaskLiveness
from libs.domain.task.model import Task, TaskSpec
from libs.domain.task.states import TERMINAL, Actor, TaskStatus

S = TaskStatus


class Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = 1


class CommandKind(StrEnum):
    START = "start"
    STOP = "stop"
    PAUSE = "pause"
    RESUME = "resume"


class GpuShare(BaseModel):
    """The fraction of one card the scheduler counted for a task: its VRAM and its compute
    share (`share_on` in services/scheduler/placement/model.py). The agent holds the task to
    exactly this, so what is accounted and what is enforced never differ
    (agent/runtimes/sharing.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu_id: str
    memory_mb: int = Field(ge=0)  # 0: no VRAM limit (a card that reports none)
    compute_ratio: float = Field(ge=0.0, le=1.0)


class TaskRunSpec(Message):
    """What a START command asks a node to run: the task's spec and its placement."""

    spec: TaskSpec
    gpu_ids: tuple[str, ...] = ()
    qos: str = ""
    tenant_id: str = ""
    group_id: str | None = None
    rank: int | None = None
    gpu_label: str = ""  # "vendor/model" of the granted cards (engine routing)
    # WORLD_SIZE, MASTER_ADDR, ... for a group member; the user's env wins over these.
    group_env: dict[str, str] = Field(default_factory=dict)
    # A static-world group's member shares its host's network (docker `network_mode: host`)
    # so its peers reach MASTER_ADDR:MASTER_PORT; set by the dispatcher (docs/groups.md).
    host_network: bool = False
    # The host port the scheduler allocated for the serving port (process runtime, host
    # network); given to the task as PORT and served on. None: the declared port.
    serve_port: int | None = None
    # A fraction's share as the scheduler counted it on the granted card. None: whole cards,
    # no card, or a command sent before the share travelled (the agent reads the spec then).
    gpu_share: GpuShare | None = None

    @model_validator(mode="after")
    def _share_on_a_granted_card(self) -> TaskRunSpec:
        if self.gpu_share is not None and self.gpu_share.gpu_id not in self.gpu_ids:
            raise ValueError(f"gpu_share names card {self.gpu_share.gpu_id}, not a granted one")
        return self


class NodeCommand(Message):
    """One instruction for one task on one node. `attempt` = the task's `attempt`."""

    kind: CommandKind
    node_id: str
    task_id: str
    attempt: int
    status: TaskStatus  # the task's status when the command was issued
    task_version: int = 0  # the task's stream version when the command was issued
    grace_s: float = 10.0
    run: TaskRunSpec | None = None  # for START only

    @property
    def msg_id(self) -> str:
        # Dedup key on the command stream: one per node and task stream version.
        return f"{self.node_id}:{self.task_id}:{self.task_version}:{self.kind.value}"


class Fact(StrEnum):
    """What an agent observed."""

    STARTING = "starting"  # container being created
    RUNNING = "running"  # process is up
    EXITED = "exited"  # process ended (exit_code, oom_killed)
    START_FAILED = "start_failed"  # could not start (error_kind: ImageNotFound, ...)
    PAUSED = "paused"
    RESUMED = "resumed"
    LOST = "lost"  # the agent no longer finds the container it ran


class AgentReport(Message):
    kind: Literal["task"] = "task"
    node_id: str
    task_id: str
    attempt: int
    fact: Fact
    expected_status: TaskStatus
    exit_code: int | None = None
    oom_killed: bool = False
    error_kind: ErrorKind | None = None
    error: str = ""
    output_tail: list[str] = Field(default_factory=list)
    container_id: str = ""
    serve_address: str = ""  # host:port of the task's serving port (docs/serving.md)
    engine: str = ""  # the engine profile applied at start (agent/engines.py)
    # PAUSED/RESUMED: "engine" (its /sleep endpoint released VRAM) or "pause" (frozen only),
    # and the VRAM its cards held before and after (None where NVML reads nothing).
    sleep_mode: str = ""
    vram_before_mb: float | None = None
    vram_after_mb: float | None = None
    memory_mb: int | None = None  # what the agent actually applied (memory boost)
    # Device evidence of a failed attempt (agent/device_log.py): kernel log lines naming a
    # card fault seen while it ran, and XIDs its runtime or NVML reported.
    device_log: list[str] = Field(default_factory=list)
    xids: list[int] = Field(default_factory=list)
    at: datetime

    @field_validator("error_kind", mode="before")
    @classmethod
    def _no_kind(cls, value: object) -> object:
        return None if value == "" else value  # reports published before the enum said ""


class Registration(Message):
    kind: Literal["register"] = "register"
    node_id: str
    inventory: NodeInventory
    at: datetime


class NodeReport(RootModel[Annotated[AgentReport | Registration, Field(discriminator="kind")]]):
    """What arrives on `hf.node.<id>.report`: a task report or a registration."""


class Heartbeat(Message):
    node_id: str
    seq: int
    visible_gpus: list[str]
    tasks: list[str] = Field(default_factory=list)
    # Per inference task: container state and health (the liveness floor, liveness.py).
    liveness: dict[str, TaskLiveness] = Field(default_factory=dict)
    at: datetime


class LogsRequest(Message):
    """Asked of one agent on `hf.node.<id>.logs` (core NATS request/reply)."""

    task_id: str
    tail: int | None = None


class LogsReply(Message):
    found: bool
    lines: list[str] = Field(default_factory=list)
    running: bool = False
    error: str = ""


def _exit_target(task: Task, report: AgentReport) -> TaskStatus:
    """Where an exit takes the task, given who asked for it to end."""
    if task.status is S.STOPPING:
        return S.STOPPED  # never completed: somebody decided to stop it
    if task.status is S.PREEMPTING:
        return S.PENDING
    if task.status is S.DRAINING:
        return S.CANCELLED
    return S.COMPLETED if report.exit_code == 0 and not report.oom_killed else S.FAILED


def _failure_text(report: AgentReport) -> str:
    if report.error_kind:
        return f"{report.error_kind.value}: {report.error}".strip(": ")
    if report.oom_killed:
        return "OOMKilled: container exceeded its memory limit"
    if report.fact is Fact.LOST:
        return "ContainerLost: the agent no longer finds the container"
    if report.exit_code not in (None, 0):
        return f"exit code {report.exit_code}"
    return report.error


def report_target(task: Task, report: AgentReport) -> TaskStatus | None:
    """The status a fact moves the task to from its current status (None = nothing to do)."""
    fact = report.fact
    if fact is Fact.STARTING:
        return S.STARTING if task.status is S.SCHEDULED else None
    if fact is Fact.RUNNING:
        return S.RUNNING if task.status in (S.SCHEDULED, S.STARTING) else None
    if fact is Fact.RESUMED:
        return S.RUNNING if task.status is S.WAKING else None
    if fact is Fact.PAUSED:
        return None
    if fact in (Fact.EXITED, Fact.START_FAILED, Fact.LOST):
        if task.status in TERMINAL or task.status is S.PENDING:
            return None
        if fact is not Fact.EXITED and task.status not in (S.STOPPING, S.PREEMPTING, S.DRAINING):
            return S.FAILED
        return _exit_target(task, report)
    return None


def decide_report(task: Task, report: AgentReport) -> list[TaskStatusChanged]:
    """Events for an agent report, compare-and-set on the status the agent expected.

    A report from an older attempt or another node changes nothing. When the task moved on
    since the agent looked (its expected status is stale), the reported transition is refused
    with Conflict; the caller may then apply `report_target` for the same fact from the
    current status (e.g. an exit while `stopping` records `stopped`, never `completed`).
    """
    if report.attempt != task.attempt or task.node_id != report.node_id:
        return []
    target = report_target(task.model_copy(update={"status": report.expected_status}), report)
    if target is None:
        return []
    if task.status is not report.expected_status:
        raise Conflict(
            f"agent expected {report.expected_status.value} but task is {task.status.value}"
        )
    return _transition(task, target, report)


def decide_reconcile(task: Task, report: AgentReport) -> list[TaskStatusChanged]:
    """After a Conflict: apply the fact from the task's current status (no CAS on the agent)."""
    if report.attempt != task.attempt or task.node_id != report.node_id:
        return []
    if task.status in (S.SCHEDULED, S.STARTING) and report.fact is Fact.EXITED:
        return _ran_unseen(task, report)
    target = report_target(task, report)
    return [] if target is None else _transition(task, target, report)


def _ran_unseen(task: Task, report: AgentReport) -> list[TaskStatusChanged]:
    """An exit for a task still `scheduled` or `starting` on the reporting node: the
    container ran while its reports were refused (an agent back after an outage, its task
    placed on it again at the same attempt) or its `running` report comes later (redelivered
    after a scheduler died holding it). The real outcome is recorded through `running`, the
    edge it took."""
    ran = report.model_copy(update={"fact": Fact.RUNNING})
    started = _transition(task, S.RUNNING, ran)
    running = evolve_task(task, started[0], report.at, task.version + 1)
    target = report_target(running, report)
    return started if target is None else started + _transition(running, target, report)


def _transition(task: Task, target: TaskStatus, report: AgentReport) -> list[TaskStatusChanged]:
    fields: dict[str, Any] = {}
    if report.container_id:
        fields["container_id"] = report.container_id
    if report.serve_address and target is S.RUNNING:
        fields["serve_address"] = report.serve_address
    if report.engine and target is S.RUNNING:
        fields["engine"] = report.engine
    if target in TERMINAL:
        fields["exit_code"] = report.exit_code
        fields["result"] = "\n".join(report.output_tail[-20:])
        if target is not S.COMPLETED:
            fields["error"] = _failure_text(report)
            fields["error_kind"] = report.error_kind.value if report.error_kind else None
            fields["oom_killed"] = report.oom_killed
            if report.device_log:
                fields["device_log"] = "\n".join(report.device_log[-20:])
            if report.xids:
                fields["xids"] = tuple(report.xids)
    if target is S.PENDING:
        fields["clear_placement"] = True
    if report.memory_mb is not None and report.memory_mb != task.spec.memory_mb:
        fields["memory_mb"] = report.memory_mb
    return decide_transition(
        task,
        target,
        actor=Actor.AGENT,
        expected_status=task.status,
        report=True,
        reason_code=report_reason(
            report.fact, task.status, target, report.error_kind.value if report.error_kind else ""
        ),
        reason=f"agent: {report.fact.value}",
        **fields,
    )
