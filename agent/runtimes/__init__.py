"""Node-agent runtimes: the `Runtime` contract and how an agent picks one.

`docker` when an engine answers, else `process`; `simulated` only when configured. The docker
module is imported lazily so a host without the docker SDK can still run the process runtime.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .base import (
    ErrorKind,
    ExitReport,
    Handle,
    HandleNotFound,
    InvalidOperation,
    RunSpec,
    RunState,
    Runtime,
    RuntimeFault,
    RuntimeStartError,
    VolumeMount,
)

RUNTIME_KINDS = ("auto", "docker", "process", "simulated")

__all__ = [
    "RUNTIME_KINDS",
    "ErrorKind",
    "ExitReport",
    "Handle",
    "HandleNotFound",
    "InvalidOperation",
    "RunSpec",
    "RunState",
    "Runtime",
    "RuntimeFault",
    "RuntimeStartError",
    "VolumeMount",
    "choose_runtime_kind",
    "create_runtime",
]


def _docker_answers() -> bool:
    from .docker import DockerRuntime

    return DockerRuntime.available()


def choose_runtime_kind(
    configured: str = "auto", docker_answers: Callable[[], bool] | None = None
) -> str:
    """`configured` unless it is "auto"; then docker when an engine answers, else process."""
    if configured not in RUNTIME_KINDS:
        raise ValueError(f"unknown runtime {configured!r}; expected one of {RUNTIME_KINDS}")
    if configured != "auto":
        return configured
    return "docker" if (docker_answers or _docker_answers)() else "process"


def create_runtime(
    configured: str = "auto",
    *,
    state_dir: Path | str,
    docker_options: dict[str, Any] | None = None,
    process_options: dict[str, Any] | None = None,
    simulated_options: dict[str, Any] | None = None,
    docker_answers: Callable[[], bool] | None = None,
) -> Runtime:
    """Build the runtime an agent should use; the options go to that runtime's constructor."""
    kind = choose_runtime_kind(configured, docker_answers)
    if kind == "docker":
        from .docker import DockerRuntime

        return DockerRuntime(**(docker_options or {}))
    if kind == "process":
        from .process import ProcessRuntime

        return ProcessRuntime(state_dir, **(process_options or {}))
    from .simulated import SimulatedRuntime

    return SimulatedRuntime(**(simulated_options or {}))
