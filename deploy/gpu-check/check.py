"""Check fractional-GPU isolation on a real NVIDIA machine (docs/scheduling.md, QoS).

Run from the repository root with the project installed, on a host with the NVIDIA driver,
Docker and the NVIDIA container toolkit:

    python deploy/gpu-check/check.py --image <an image with nvidia-smi, ideally torch>

Each check prints PASS, FAIL or SKIP (with why) and the script exits 1 on any FAIL:

1. NVML inventory: every card, its MIG mode, and the MIG instances of MIG-enabled cards.
2. silver: the MPS control daemon is joined or started; a container built exactly as the
   docker runtime builds a 4 GB / 25 % fraction sees one card, and inside it CUDA reports at
   most 4 GB of device memory (torch, when the image has it).
3. gold: on a MIG-enabled card with a free instance, the container built for a fraction sees
   exactly that instance (`nvidia-smi -L` lists one MIG device, with the chosen UUID).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import docker

from agent.inventory import detect_nvidia
from agent.runtimes.base import RunSpec
from agent.runtimes.docker import DockerRuntime
from agent.runtimes.sharing import GOLD, SILVER, MpsDaemon, choose_mig, mig_instances

MEM_PROBE = (
    "nvidia-smi -L; python3 -c 'import torch; f, t = torch.cuda.mem_get_info(); "
    'print("cuda_total_mb", t // 2**20)\' 2>/dev/null || echo "no torch in the image"'
)
failures = 0


def report(name: str, ok: bool | None, detail: str) -> None:
    global failures
    word = "SKIP" if ok is None else "PASS" if ok else "FAIL"
    failures += ok is False
    print(f"{word:4}  {name}: {detail}")


def run(rt: DockerRuntime, spec: RunSpec, mig: Any = None) -> str:
    kwargs = rt._create_kwargs(spec, mig)
    kwargs.pop("detach", None)
    kwargs.pop("restart_policy", None)
    kwargs["user"] = None  # the image's own user: nvidia-smi needs no more
    out: bytes = rt.client.containers.run(**kwargs, remove=True, stdout=True, stderr=True)
    return out.decode(errors="replace")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image", required=True, help="an image with nvidia-smi")
    parser.add_argument("--mps-pipe-dir", default="/tmp/nvidia-mps")
    args = parser.parse_args()

    cards = detect_nvidia()
    report("nvml", bool(cards), f"{len(cards)} card(s)")
    for c in cards:
        extra = ""
        if c.mig_enabled:
            extra = ", instances: " + ", ".join(
                f"{m.uuid} {m.memory_mb} MB" for m in mig_instances(c.uuid)
            )
        print(f"      {c.index} {c.model} {c.vram_mb} MB mig={c.mig_enabled}{extra}")
    if not cards:
        return 1
    rt = DockerRuntime(client=docker.from_env(), mps=MpsDaemon(args.mps_pipe_dir))
    spec = {"attempt": 0, "image": args.image, "command": MEM_PROBE, "gpu_vendor": "nvidia"}

    plain = next((c for c in cards if not c.mig_enabled), None)
    if plain is None:
        report("silver", None, "every card has MIG enabled")
    else:
        rt.mps.ensure()
        report("silver: mps daemon", rt.mps.running(), f"control pipe in {args.mps_pipe_dir}")
        out = run(
            rt,
            RunSpec(
                task_id="gpucheck-silver",
                gpu_ids=(plain.uuid,),
                qos=SILVER,
                gpu_memory_mb=4096,
                gpu_compute_ratio=0.25,
                **spec,
            ),
        )
        print("      " + out.strip().replace("\n", "\n      "))
        visible = [line for line in out.splitlines() if line.startswith("GPU ")]
        report("silver: one card visible", len(visible) == 1, f"{len(visible)} listed")
        totals = [int(line.split()[1]) for line in out.splitlines() if line.startswith("cuda_")]
        report(
            "silver: memory limit",
            totals[0] <= 4096 if totals else None,
            f"CUDA sees {totals[0]} MB" if totals else "needs torch in the image",
        )

    gold = next((c for c in cards if c.mig_enabled), None)
    mig = choose_mig(mig_instances(gold.uuid), 1, ()) if gold else None
    if gold is None or mig is None:
        report("gold", None, "no MIG-enabled card with an instance")
    else:
        out = run(
            rt,
            RunSpec(
                task_id="gpucheck-gold",
                gpu_ids=(gold.uuid,),
                qos=GOLD,
                gpu_memory_mb=mig.memory_mb,
                **spec,
            ),
            mig,
        )
        migs = [line for line in out.splitlines() if "MIG" in line and "UUID: MIG-" in line]
        ok = len(migs) == 1 and mig.uuid in migs[0]
        report("gold: only its instance visible", ok, f"{len(migs)} MIG device(s): {migs}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
