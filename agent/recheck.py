"""The agent's second look at a start command, before any runtime sees it.

The gateway validates every task on entry; an agent checks again what reaches it over NATS,
so a forged or stale command (from a leaked scheduler credential, an old platform, a bug)
cannot mount what the node's operator did not allow.

The gateway sees only a path's text; the agent resolves each volume's host path on its own
host at every start (`resolve_host_path`): every symlink on the path is followed, and the
real path must lie under one of the real prefixes of the task's tenant (libs/domain/task/model.py
`tenant_allow_list`). A symlink a task planted in a directory it may write (`ln -s / x`), a
symlinked parent or a `..` is refused naming the volume; the runtime is given the resolved
path, so a bind source it receives holds no symlink at the time of the check.

There are no privileged options to refuse: a `RunSpec` has no field for privileges,
capabilities, devices, users or networks (unknown fields fail its validation); runtimes set
those themselves from the node's settings.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable

from libs.domain.task.model import host_path_allowed, tenant_allow_list
from libs.domain.validation import image_reference_error, normalise_container_path

from .runtimes.base import RunSpec, VolumeMount


def resolve_host_path(host_path: str, prefixes: Iterable[str]) -> tuple[str, str | None]:
    """(the real path on this host, why it is refused or None).

    The text is checked first (absolute, no `..` segment, under a prefix); then every
    symlink on the path is followed (`realpath`; a part that does not exist yet is kept as
    written, and the runtime reports it missing) and the result must lie under the real path
    of one of `prefixes` (an operator's prefix may itself be a symlink)."""
    allow = list(prefixes)
    listed = ", ".join(allow) or "none configured"
    if not host_path_allowed(host_path, allow):
        return host_path, f"is not under this node's allow-list ({listed})"
    real = os.path.realpath(host_path)
    if host_path_allowed(real, [os.path.realpath(p) for p in allow]):
        return real, None
    return real, f"resolves to {real!r} on this node, outside its allow-list ({listed})"


def checked(run: RunSpec, volume_allow_list: Iterable[str]) -> tuple[RunSpec, str | None]:
    """(`run` with each volume's host path resolved, why this node refuses it or None)."""
    if run.image and (why := image_reference_error(run.image)):
        return run, f"image {why}"
    allow = tenant_allow_list(volume_allow_list, run.tenant_id)
    volumes: list[VolumeMount] = []
    for i, vol in enumerate(run.volumes):
        try:
            normalise_container_path(vol.container_path)
        except ValueError as exc:
            return run, f"volumes[{i}]: {exc}"
        real, why = resolve_host_path(vol.host_path, allow)
        if why:
            tenant = f" for tenant {run.tenant_id}" if run.tenant_id else ""
            return run, f"volumes[{i}].host_path {vol.host_path!r}{tenant} {why}"
        volumes.append(vol.model_copy(update={"host_path": posixpath.normpath(real)}))
    bad_env = sorted(k for k in run.env if k.startswith("HETEROFLOW_"))
    if bad_env:
        return run, f"env keys reserved to the platform: {', '.join(bad_env)}"
    return run.model_copy(update={"volumes": tuple(volumes)}), None


def refusal(run: RunSpec, volume_allow_list: Iterable[str]) -> str | None:
    """Why this node refuses to run `run`, or None."""
    return checked(run, volume_allow_list)[1]
