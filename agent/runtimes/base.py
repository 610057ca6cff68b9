"""The contract every node-agent runtime fulfils: what to run, how it ended, and the verbs.

The agent's command handlers speak only this interface; `docker`, `process` and `simulated`
implement it. Runtime failures are translated here into the error kinds of SPEC §4, so the
retry engine can classify them without knowing which runtime produced them.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The kinds travel in agent reports, so the message-facing enum lives in the domain.
from libs.domain.task.failure import ErrorKind as ErrorKind

#: How many trailing output lines an `ExitReport` carries.
OUTPUT_TAIL_LINES = 50

#: Labels a runtime puts on what it starts, so a restarted agent can find its work again.
LABEL_MANAGED = "heteroflow.managed"
LABEL_TASK_ID = "heteroflow.task_id"
LABEL_NODE = "heteroflow.node"
LABEL_ATTEMPT = "heteroflow.attempt"
# The platform installation that started it: agents adopt only their own installation's.
LABEL_INSTALLATION = "heteroflow.installation"
# The MIG instance a gold fraction holds (agent/runtimes/sharing.py).
LABEL_MIG = "heteroflow.mig"

# Task ids end up in container names and directory names: keep them to a safe alphabet
# (no path separators, no `..`).
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class RunState(StrEnum):
    CREATED = "created"  # accepted but not started yet
    RUNNING = "running"
    PAUSED = "paused"
    EXITED = "exited"
    MISSING = "missing"  # the runtime no longer knows it (removed, or lost with the host)


class VolumeMount(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    host_path: str = Field(min_length=1)
    container_path: str = Field(min_length=1)
    read_only: bool = False


class RunSpec(BaseModel):
    """Everything a runtime needs to start one attempt of one task."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str
    attempt: int = Field(ge=0)
    image: str = ""  # empty: no image (the process runtime ignores it; docker refuses it)
    command: str = ""  # run with `sh -c`; empty = the image's own entrypoint/cmd
    env: dict[str, str] = Field(default_factory=dict)
    volumes: tuple[VolumeMount, ...] = ()
    memory_mb: int = Field(default=2048, gt=0)
    cpu_cores: float = Field(default=1.0, gt=0)
    gpu_ids: tuple[str, ...] = ()  # device indices or UUIDs, as the inventory reported them
    gpu_vendor: str = ""  # "nvidia", "amd", ...; empty when no GPU
    # A fraction of one card (docs/scheduling.md): its QoS, memory and compute share.
    qos: str = ""  # gold | silver | bronze; "" for whole cards
    gpu_memory_mb: int = Field(default=0, ge=0)
    gpu_compute_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    labels: dict[str, str] = Field(default_factory=dict)
    # The task's serving port (docs/serving.md) and the host address to publish it on.
    serve_port: int | None = Field(default=None, ge=1, le=65535)
    serve_host: str = "127.0.0.1"
    # The host's network namespace (a static-world group's member, docs/groups.md): its
    # ports are the host's, so the serving port is served as it is, never mapped.
    host_network: bool = False
    tenant_id: str = ""  # whose work: the docker runtime's network and user follow it

    @field_validator("task_id")
    @classmethod
    def _safe_task_id(cls, v: str) -> str:
        if not _SAFE_ID.match(v):
            raise ValueError("task_id must match [A-Za-z0-9][A-Za-z0-9_.-]* (≤128 chars)")
        return v

    @property
    def name(self) -> str:
        """Stable name of this attempt: `hf-<task_id>-<attempt>`."""
        return f"hf-{self.task_id}-{self.attempt}"

    def managed_labels(self) -> dict[str, str]:
        """User labels plus the runtime's own (which win on a clash)."""
        return {
            **self.labels,
            LABEL_MANAGED: "true",
            LABEL_TASK_ID: self.task_id,
            LABEL_ATTEMPT: str(self.attempt),
        }


class Handle(BaseModel):
    """A started attempt: which runtime holds it, its id there, and whose it is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runtime: str
    id: str  # container id, pid, or a simulated id
    task_id: str
    attempt: int


class ExitReport(BaseModel):
    """How an attempt ended."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    exit_code: int | None  # None when the runtime cannot know it (see `error`)
    oom_killed: bool = False  # ended by a CPU-memory limit (not GPU OOM)
    error: str | None = None  # "<ErrorKind or cause>: detail" when the runtime saw a failure
    xids: list[int] = Field(default_factory=list)  # NVIDIA XIDs of its cards (simulated, NVML)
    output_tail: list[str] = Field(default_factory=list)
    finished_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0 and not self.oom_killed and self.error is None


# How tenant networks are kept apart (networks.py; the agent's container_isolation).
ISOLATIONS: tuple[str, ...] = ("auto", "docker", "iptables", "none")

# What a container running as the image's user (root in most images) keeps: Docker's default
# set less NET_RAW (raw sockets: spoofed packets on the tenant network), MKNOD (device nodes),
# AUDIT_WRITE and SETFCAP (file capabilities). Enough for package managers, chown in
# entrypoints, dropping to another user, and binding ports below 1024 (docs/security.md).
KEPT_CAPABILITIES: tuple[str, ...] = (
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
)
LINUX_CAPABILITIES: frozenset[str] = frozenset(
    [
        "AUDIT_CONTROL",
        "AUDIT_READ",
        "AUDIT_WRITE",
        "BLOCK_SUSPEND",
        "BPF",
        "CHECKPOINT_RESTORE",
        "CHOWN",
        "DAC_OVERRIDE",
        "DAC_READ_SEARCH",
        "FOWNER",
        "FSETID",
        "IPC_LOCK",
        "IPC_OWNER",
        "KILL",
        "LEASE",
        "LINUX_IMMUTABLE",
        "MAC_ADMIN",
        "MAC_OVERRIDE",
        "MKNOD",
        "NET_ADMIN",
        "NET_BIND_SERVICE",
        "NET_BROADCAST",
        "NET_RAW",
        "PERFMON",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_ADMIN",
        "SYS_BOOT",
        "SYS_CHROOT",
        "SYS_MODULE",
        "SYS_NICE",
        "SYS_PACCT",
        "SYS_PTRACE",
        "SYS_RAWIO",
        "SYS_RESOURCE",
        "SYS_TIME",
        "SYS_TTY_CONFIG",
        "SYSLOG",
        "WAKE_ALARM",
    ]
)


class RuntimeFault(Exception):
    """Base of every error a runtime raises on purpose."""


class RuntimeStartError(RuntimeFault):
    """The attempt could not be started; `kind` says why in SPEC §4 terms."""

    def __init__(self, kind: ErrorKind | str, message: str) -> None:
        self.kind = ErrorKind(kind)
        self.message = message
        super().__init__(f"{self.kind.value}: {message}")


class HandleNotFound(RuntimeFault):
    """The runtime no longer knows this handle (removed, or lost)."""

    def __init__(self, handle: Handle) -> None:
        self.handle = handle
        super().__init__(
            f"{handle.runtime} {handle.id} ({handle.task_id}/{handle.attempt}) is gone"
        )


class InvalidOperation(RuntimeFault):
    """The verb does not apply in the attempt's current state (e.g. pausing an exited task)."""


class Runtime(ABC):
    """One node's way of running attempts. All verbs are coroutines; none blocks the loop.

    Idempotency: `start` of an attempt that already exists returns the existing handle;
    `stop`, `unpause` and `remove` of something already in the target state do nothing.
    """

    name: ClassVar[str]

    @abstractmethod
    async def start(self, spec: RunSpec) -> Handle:
        """Start the attempt; raise `RuntimeStartError` when it cannot run."""

    @abstractmethod
    async def wait(self, handle: Handle) -> ExitReport:
        """Wait until the attempt ends. Cancelling the caller is safe."""

    @abstractmethod
    async def stop(self, handle: Handle, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `grace_s`. A paused attempt is stopped too."""

    @abstractmethod
    async def pause(self, handle: Handle) -> None:
        """Freeze the attempt (the `sleep` operation)."""

    @abstractmethod
    async def unpause(self, handle: Handle) -> None:
        """Resume a frozen attempt."""

    @abstractmethod
    async def logs(self, handle: Handle, tail: int | None = None) -> list[str]:
        """Output lines so far (stdout and stderr interleaved); the last `tail` when given."""

    @abstractmethod
    def follow_logs(self, handle: Handle, tail: int | None = None) -> AsyncGenerator[str, None]:
        """Yield output lines as they come (the last `tail` first); ends when the attempt ends.

        A consumer that stops early (an HTTP client went away) must `aclose()` the generator,
        which releases the engine stream at once."""

    @abstractmethod
    async def inspect(self, handle: Handle) -> RunState:
        """Current state; `MISSING` rather than an exception when it is gone."""

    @abstractmethod
    async def list_managed(self) -> list[Handle]:
        """Every attempt this runtime manages on this node, running or ended but not removed.

        A restarted agent calls this to re-adopt its work; the handles carry task id and attempt.
        """

    @abstractmethod
    async def remove(self, handle: Handle) -> None:
        """Forget the attempt and free what it holds (kills it first if it still runs)."""

    async def endpoint(self, handle: Handle, spec: RunSpec) -> str:
        """`host:port` where the attempt's serving port answers ("" when none is declared).
        Runtimes without port mapping (process, simulated) serve on the port itself."""
        return f"{spec.serve_host}:{spec.serve_port}" if spec.serve_port else ""

    def node_facts(self) -> dict[str, Any]:
        """Inventory fields this runtime knows about its node (`userns_remap`, `cgroups`).
        Blocking; called once at start-up, in a thread."""
        return {}

    async def close(self) -> None:  # noqa: B027 - optional hook, most runtimes hold nothing
        """Release connections and threads held by the runtime object."""


def tail_lines(lines: list[str], tail: int | None) -> list[str]:
    if tail is None:
        return lines
    if tail <= 0:
        return []
    return lines[-tail:]


def split_output(data: bytes) -> list[str]:
    """Decode runtime output into lines (no trailing newline, undecodable bytes replaced)."""
    return data.decode("utf-8", errors="replace").splitlines()


class LineAssembler:
    """Turns arbitrary output chunks into whole lines (streams split lines anywhere)."""

    def __init__(self) -> None:
        self._partial = b""

    def feed(self, chunk: bytes) -> list[str]:
        data = self._partial + chunk
        head, sep, rest = data.rpartition(b"\n")
        if not sep:
            self._partial = data
            return []
        self._partial = rest
        return split_output(head + b"\n")

    def flush(self) -> list[str]:
        rest, self._partial = self._partial, b""
        return split_output(rest) if rest else []


def gpu_visibility_env(vendor: str, gpu_ids: tuple[str, ...]) -> dict[str, str]:
    """Environment that restricts a process to the granted GPUs, for runtimes without
    device isolation (the docker runtime passes NVIDIA devices through `device_requests`)."""
    if not gpu_ids:
        return {}
    ids = ",".join(gpu_ids)
    match vendor.lower():
        case "nvidia":
            return {"CUDA_VISIBLE_DEVICES": ids, "NVIDIA_VISIBLE_DEVICES": ids}
        case "amd":
            return {"ROCR_VISIBLE_DEVICES": ids, "HIP_VISIBLE_DEVICES": ids}
        case "intel":
            return {"ZE_AFFINITY_MASK": ids}
        case _:
            return {}
