"""The agent's second look at a start command, before any runtime sees it.

The gateway validates every task on entry; an agent checks again what reaches it over NATS,
so a forged or stale command (from a leaked scheduler credential, an old platform, a bug)
cannot mount what the node's operator did not allow. Pure: returns why a run is refused.

There are no privileged options to refuse: a `RunSpec` has no field for privileges,
capabilities, devices, users or networks (unknown fields fail its validation); runtimes set
those themselves from the node's settings.
"""

from __future__ import annotations

from collections.abc import Iterable

from libs.domain.task import host_path_allowed
from libs.domain.validation import image_reference_error, normalise_container_path

from .runtimes.base import RunSpec


def refusal(run: RunSpec, volume_allow_list: Iterable[str]) -> str | None:
    """Why this node refuses to run `run`, or None."""
    allow = list(volume_allow_list)
    if run.image and (why := image_reference_error(run.image)):
        return f"image {why}"
    for i, vol in enumerate(run.volumes):
        if not host_path_allowed(vol.host_path, allow):
            return (
                f"volumes[{i}].host_path {vol.host_path!r} is not under this node's allow-list "
                f"({', '.join(allow) or 'none configured'})"
            )
        try:
            normalise_container_path(vol.container_path)
        except ValueError as exc:
            return f"volumes[{i}]: {exc}"
    bad_env = sorted(k for k in run.env if k.startswith("HETEROFLOW_"))
    if bad_env:
        return f"env keys reserved to the platform: {', '.join(bad_env)}"
    return None
