"""What a START command becomes on this node: the runtime's RunSpec (engine profile, group
and user environment, published serving port) and the running timeout.

The memory is the spec's as placed: the inference memory boost is applied when the task is
created (libs/domain/task/boost.py), so the node runs what the scheduler counted; so is a
fraction's share of its card (`TaskRunSpec.gpu_share`, agent/runtimes/sharing.py)."""

from __future__ import annotations

from libs.domain.protocol import NodeCommand

from .engines import profile, profile_env
from .inventory import Inventory
from .runtimes.base import LABEL_NODE, RunSpec
from .runtimes.sharing import held_share


def card_vendor(inventory: Inventory, gpu_ids: tuple[str, ...]) -> str:
    vendors = {g.uuid: g.vendor for g in inventory.gpus}
    return vendors.get(gpu_ids[0], "") if gpu_ids else ""


def engine_profile(cmd: NodeCommand, inventory: Inventory) -> str:
    """The engine profile of an inference task (agent/engines.py); "" otherwise."""
    assert cmd.run is not None
    if not cmd.run.spec.is_inference:
        return ""
    ids = cmd.run.gpu_ids
    return profile(cmd.run.spec.image, cmd.run.gpu_label, ids, card_vendor(inventory, ids))


def _indices(gpu_ids: tuple[str, ...], vendor: str, runtime: str) -> tuple[str, ...]:
    # Docker renumbers the NVIDIA cards it passes in from 0; elsewhere the ids hold.
    if runtime == "docker" and vendor.lower() == "nvidia":
        return tuple(str(i) for i in range(len(gpu_ids)))
    return gpu_ids


def run_spec(
    cmd: NodeCommand, inventory: Inventory, node_id: str, address: str, runtime: str
) -> tuple[RunSpec, float]:
    """(the RunSpec, the timeout; 0 = none)."""
    assert cmd.run is not None
    spec = cmd.run.spec
    gpu_ids = cmd.run.gpu_ids
    vendor = card_vendor(inventory, gpu_ids)
    engine_env = profile_env(
        engine_profile(cmd, inventory), gpu_ids, _indices(gpu_ids, vendor, runtime)
    )
    # The serving port: the one the scheduler allocated on this host (process runtime, host
    # network), else the declared one (mapped to a free host port by docker). PORT tells the
    # task where to listen (docs/serving.md#port); a declared one only where the task sets
    # no PORT of its own.
    port = cmd.run.serve_port or (spec.serving.port if spec.serving else None)
    told = port and (cmd.run.serve_port or "PORT" not in spec.env)
    port_env = {"PORT": str(port)} if told else {}
    # A fraction: the share the scheduler counted (its limits under MPS, its MIG instance).
    memory_mb, compute_ratio = held_share(cmd.run)
    run = RunSpec(
        task_id=cmd.task_id,
        attempt=cmd.attempt,
        image=spec.image,
        command=spec.command,
        # User values win, except an allocated PORT: the router reaches the task there.
        env=engine_env | dict(cmd.run.group_env) | dict(spec.env) | port_env,
        volumes=tuple(v.model_dump() for v in spec.volumes),
        memory_mb=spec.memory_mb,
        cpu_cores=spec.cpu_cores,
        gpu_ids=gpu_ids,
        gpu_vendor=vendor,
        qos=cmd.run.qos if spec.is_fractional else "",
        gpu_memory_mb=memory_mb,
        gpu_compute_ratio=compute_ratio,
        labels={"heteroflow.tenant": cmd.run.tenant_id, LABEL_NODE: node_id},
        serve_port=port,
        serve_host=address,
        tenant_id=cmd.run.tenant_id,
        host_network=cmd.run.host_network,
    )
    # Inference servers run until stopped: no running timeout (SPEC §5).
    timeout = 0.0 if spec.is_inference else float(spec.timeout)
    return run, timeout
