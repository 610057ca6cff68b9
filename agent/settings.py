"""The node agent's settings (prefix `HETEROFLOW_`) and the inventory it registers.

Declared resources override what the agent detects: `node_cpu_cores` and `node_memory_mb`
replace the host's counts, `declared_gpus` adds cards pynvml cannot see, `node_labels` are the
node's labels. `heteroflow up` passes the same settings to its local agent.
"""

from __future__ import annotations

import socket
from pathlib import Path

from pydantic import Field, SecretStr, field_validator

from libs.config import DEFAULT_VOLUME_ALLOW_LIST, CommonSettings, VolumeAllowList
from libs.domain.node.model import DEFAULT_PORT_RANGE, GpuCard, NodeInventory

from .inventory import Inventory
from .runtimes.base import ISOLATIONS, KEPT_CAPABILITIES, LINUX_CAPABILITIES
from .runtimes.cgroups import MODES as CGROUP_MODES
from .runtimes.sharing import DEFAULT_MPS_LOG_DIR, DEFAULT_MPS_PIPE_DIR, MpsDaemon


class AgentSettings(CommonSettings):
    node_id: str = Field(default_factory=socket.gethostname, description="default: host name")
    runtime: str = Field(default="auto", description="auto | docker | process | simulated")
    declared_gpus: str = Field(
        default="", description='cards pynvml cannot see, e.g. "amd:MI300X:196608x2"'
    )
    detect_nvidia: bool = Field(default=True, description="ask pynvml for NVIDIA cards")
    declared_vram_file: Path | None = Field(
        default=None,
        description="JSON map card id → MB in use, read for cards NVML cannot see (the sleep "
        "measurement that makes a card lendable, docs/serving.md#card-lending)",
    )
    vendor_tool_outputs: Path | None = Field(
        default=None,
        description="directory of recorded vendor tool outputs (amd-smi, rocm-smi, npu-smi) read "
        "instead of running the tools: simulated nodes' telemetry (docs/runtimes.md)",
    )
    kernel_log: Path | None = Field(
        default=None,
        description="file the kernel's device lines (NVRM Xid, amdgpu RAS) are read from "
        "instead of dmesg, e.g. /var/log/kern.log (docs/operations.md, device faults)",
    )
    node_labels: dict[str, str] = Field(default_factory=dict, description="JSON map")
    node_cpu_cores: int | None = Field(
        default=None, ge=1, description="CPU cores to offer; unset = the host's count"
    )
    node_memory_mb: int | None = Field(
        default=None, ge=1, description="memory (MB) to offer; unset = the host's total"
    )
    agent_token: SecretStr | None = Field(
        default=None,
        description="this node's agent key (POST /api/v1/nodes/{id}/credentials): its NATS "
        "password as user agent-<node_id> when HETEROFLOW_NATS_URL carries no credentials",
    )
    join_token: SecretStr | None = Field(
        default=None,
        description="one-time join token (POST /api/v1/nodes/join-tokens): without an agent "
        "key, the agent registers itself at HETEROFLOW_SERVER and keeps the key in its state dir",
    )
    server: str = Field(default="", description="the API's URL, for joining with a join token")
    address: str = Field(
        default_factory=lambda: default_address(),
        description="the address other nodes reach this one at (MASTER_ADDR, the router's "
        "target); default: the address of the default route's interface, else 127.0.0.1",
    )
    host_id: str = Field(
        default_factory=lambda: machine_id(),
        description="the machine this agent runs on; agents on one machine share its ports "
        "and loopback; default: /etc/machine-id, else the host name",
    )
    port_range: str = Field(
        default=f"{DEFAULT_PORT_RANGE[0]}-{DEFAULT_PORT_RANGE[1]}",
        pattern=r"^\d{4,5}-\d{4,5}$",
        description="host ports the scheduler allocates on this node (static-world groups' "
        "MASTER_PORT, serving PORT without port mapping), first-last",
    )
    heartbeat_interval_s: float = 2.0
    telemetry_interval_s: float = Field(default=10.0, description="NVML sampling period")
    state_dir: Path | None = Field(
        default=None, description="process-runtime state; default $HETEROFLOW_HOME/agents/<node>"
    )
    agent_max_concurrent_commands: int = Field(
        default=32, ge=1, description="commands applied at once; one task's stay in order"
    )
    finished_keep: int = Field(
        default=100, ge=0, description="finished attempts whose logs stay (task dir/container)"
    )
    finished_keep_s: float = Field(
        default=3600.0, ge=0, description="and none kept longer than this; 0 = no age limit"
    )
    attempt_record_keep_s: float = Field(
        default=2 * 86400.0,
        ge=0,
        description="how long the record of an ended attempt is kept (agent/attempts.py: a "
        "START redelivered for it is answered from the record, not run again); longer than "
        "a command waits on the stream (1 day); 0 = kept for ever",
    )
    installation_id: str = Field(
        default="",
        description="the platform installation's id; unset = $HETEROFLOW_HOME/installation_id",
    )
    remove_finished: bool = Field(
        default=True, description="false: keep every finished task dir and container"
    )
    volume_allow_list: VolumeAllowList = Field(
        default_factory=lambda: list(DEFAULT_VOLUME_ALLOW_LIST),
        description="host_path prefixes this node mounts (/prefix, /prefix/{tenant}, "
        "<tenant>=/prefix), resolved on the host at every start",
    )
    container_user: str = Field(
        default="",
        description="uid:gid forced on tenant containers (docker); unset = the image's user",
    )
    root_tenants: list[str] = Field(
        default_factory=list,
        description="tenants whose containers keep the image's user where container_user "
        "forces one",
    )
    container_capabilities: list[str] = Field(
        default_factory=lambda: list(KEPT_CAPABILITIES),
        description="capabilities a container running as the image's user keeps; every other "
        "one is dropped (docker; docs/security.md)",
    )
    container_read_only_root: bool = Field(
        default=False, description="read-only root filesystem, tmpfs /tmp (docker)"
    )
    container_nofile: int = Field(default=16384, ge=64, description="open-files limit (docker)")
    container_isolation: str = Field(
        default="auto",
        description="auto | docker | iptables | none: how tenant networks are kept apart; "
        "auto: docker where dockerd manages iptables, else the agent's own iptables rules, "
        "else none (reported in the node's inventory)",
    )
    mps_pipe_dir: str = Field(
        default=DEFAULT_MPS_PIPE_DIR,
        description="the MPS control daemon's pipe directory (silver fractions; joined if "
        "the daemon runs, else started)",
    )
    mps_log_dir: str = Field(default=DEFAULT_MPS_LOG_DIR, description="its log directory")
    cgroups: str = Field(
        default="auto",
        description="auto | v2 | v1 | none: how the process runtime limits a task's memory, "
        "CPUs and pids (docs/runtimes.md#limits)",
    )
    cgroup_parent: str = Field(
        default="",
        description="cgroup path under which each process task gets a cgroup; unset = "
        "<the agent's own cgroup>/heteroflow, else /heteroflow",
    )
    process_pids_limit: int = Field(default=4096, ge=16, description="pids per process task")

    @field_validator("container_capabilities")
    @classmethod
    def _known_capabilities(cls, value: list[str]) -> list[str]:
        names = [c.strip().upper().removeprefix("CAP_") for c in value]
        unknown = [c for c in names if c not in LINUX_CAPABILITIES]
        if unknown:
            raise ValueError(f"container_capabilities: unknown capability {', '.join(unknown)}")
        return names

    @field_validator("container_isolation")
    @classmethod
    def _isolation(cls, value: str) -> str:
        if value not in ISOLATIONS:
            raise ValueError(
                f"container_isolation: {value!r} is not one of {', '.join(ISOLATIONS)}"
            )
        return value

    @field_validator("cgroups")
    @classmethod
    def _cgroup_mode(cls, value: str) -> str:
        if value not in CGROUP_MODES:
            raise ValueError(f"cgroups: {value!r} is not one of {', '.join(CGROUP_MODES)}")
        return value

    def docker_options(self) -> dict[str, object]:
        return {
            "owner": self.node_id,
            "user": self.container_user or None,
            "root_tenants": frozenset(self.root_tenants),
            "capabilities": tuple(self.container_capabilities),
            "read_only_root": self.container_read_only_root,
            "nofile": self.container_nofile,
            "isolation": self.container_isolation,
            "mps": MpsDaemon(self.mps_pipe_dir, self.mps_log_dir),
        }

    def process_options(self) -> dict[str, object]:
        return {
            "cgroups": self.cgroups,
            "cgroup_parent": self.cgroup_parent,
            "pids_limit": self.process_pids_limit,
        }

    def resolved_state_dir(self) -> Path:
        return self.state_dir or self.home / "agents" / self.node_id


def default_address() -> str:
    """The source address of the default route (a UDP socket routed, nothing sent), else
    loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: routed by the default route, never used
            address = str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"
    return address if address and address != "0.0.0.0" else "127.0.0.1"


def machine_id() -> str:
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text:
            return text
    return socket.gethostname()


def port_range(text: str) -> tuple[int, int]:
    first, _, last = text.partition("-")
    lo, hi = int(first), int(last)
    if not 1024 <= lo <= hi <= 65535:
        raise ValueError(f"HETEROFLOW_PORT_RANGE {text!r}: want first-last within 1024-65535")
    return lo, hi


def declared(inv: Inventory, settings: AgentSettings) -> Inventory:
    """`inv` with the declared CPU and memory in place of the detected ones, and the host
    identity and port range the scheduler allocates ports from."""
    update: dict[str, object] = {
        "host_id": settings.host_id,
        "port_range": port_range(settings.port_range),
    }
    if settings.node_cpu_cores is not None:
        update["cpu_cores"] = settings.node_cpu_cores
    if settings.node_memory_mb is not None:
        update["memory_mb"] = settings.node_memory_mb
    return inv.model_copy(update=update)


def node_inventory(
    inv: Inventory, address: str, telemetry: dict[str, str] | None = None
) -> NodeInventory:
    return NodeInventory(
        hostname=inv.hostname,
        address=address,
        host_id=inv.host_id,
        port_range=inv.port_range,
        memory_mb=inv.memory_mb,
        cpu_cores=inv.cpu_cores,
        labels=inv.labels,
        runtime=inv.runtime,
        isolation=inv.isolation,
        userns_remap=inv.userns_remap,
        cgroups=inv.cgroups,
        telemetry=dict(telemetry or {}),
        gpus=tuple(
            GpuCard(
                id=g.uuid,
                index=g.index,
                vendor=g.vendor,
                model=g.model,
                vram_mb=g.vram_mb,
                mig_capable=g.mig_capable,
                mig_enabled=g.mig_enabled,
            )
            for g in inv.gpus
        ),
    )
