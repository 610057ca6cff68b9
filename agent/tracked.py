"""What the agent remembers of each attempt it runs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from libs.domain.protocol import NodeCommand
from libs.domain.task.model import TaskSpec
from libs.domain.task.states import TaskStatus

from .runtimes.base import Handle


@dataclass
class Tracked:
    handle: Handle
    expected: TaskStatus
    timeout_s: float = 0.0
    gpu_ids: tuple[str, ...] = ()
    waiter: asyncio.Task[None] | None = None
    timed_out: bool = False
    serve_address: str = ""
    engine_slept: bool = False  # asleep through the engine's /sleep, not frozen
    inference: bool = False  # reported in the heartbeats' liveness evidence
    health_path: str = ""
    kernel_mark: int = -1  # the kernel log's end when a GPU attempt started (device_log.py)
    started_wall: float = 0.0  # when it started (time.time()): its cards' XIDs since count
    ecc_at_start: dict[str, int] | None = None  # its cards' uncorrectable ECC counts then

    @property
    def health_url(self) -> str:
        if not (self.health_path and self.serve_address):
            return ""
        return f"http://{self.serve_address}{self.health_path}"


def spec_of(cmd: NodeCommand) -> TaskSpec:
    assert cmd.run is not None
    return cmd.run.spec
