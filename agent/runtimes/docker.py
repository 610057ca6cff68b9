"""The production runtime: one Docker container per attempt, through the docker SDK.

Containers are named `hf-<task_id>-<attempt>` and labelled so a restarted agent can re-adopt
them. They run unprivileged (`no-new-privileges`, Docker's default capabilities less the risky
ones, memory/CPU/pids limits, swap disabled, an open-files limit), as the image's user unless
the node's operator forces a uid:gid (then with no capability at all), optionally on a
read-only root filesystem with a tmpfs `/tmp`, each tenant on a network of its own
(networks.py); they are never auto-removed, so their output stays readable after they end;
`remove` is a separate verb. The SDK blocks, so every call runs in the runtime's own thread
pool: a long `wait` or log stream never starves the loop's default executor.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import threading
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from typing import Any, ClassVar, TypeVar

import docker
import docker.errors
import requests
import structlog
from docker.models.containers import Container
from docker.types import DeviceRequest, LogConfig, Mount, Ulimit

from .base import (
    KEPT_CAPABILITIES,
    LABEL_ATTEMPT,
    LABEL_INSTALLATION,
    LABEL_MANAGED,
    LABEL_MIG,
    LABEL_NODE,
    LABEL_TASK_ID,
    OUTPUT_TAIL_LINES,
    ErrorKind,
    ExitReport,
    Handle,
    HandleNotFound,
    InvalidOperation,
    LineAssembler,
    RunSpec,
    RunState,
    Runtime,
    RuntimeFault,
    RuntimeStartError,
    gpu_visibility_env,
    split_output,
)
from .daemon_threads import DaemonThreads
from .networks import TenantNetworks
from .networks import prune as networks_prune
from .sharing import GOLD, SILVER, MigInstance, MpsDaemon, choose_mig, mig_instances, mps_env

log = structlog.get_logger(__name__)

T = TypeVar("T")

_STATES: dict[str, RunState] = {
    "created": RunState.CREATED,
    "running": RunState.RUNNING,
    "restarting": RunState.RUNNING,
    "paused": RunState.PAUSED,
    "exited": RunState.EXITED,
    "dead": RunState.EXITED,
    "removing": RunState.EXITED,
}

# Engine messages → SPEC §4 kinds, first match wins. Anything unmatched: 4xx → InvalidConfig,
# 5xx → ContainerRuntimeError.
_API_ERRORS: tuple[tuple[re.Pattern[str], ErrorKind], ...] = tuple(
    (re.compile(p, re.IGNORECASE), k)
    for p, k in (
        (r"no such image|manifest unknown|repository does not exist", ErrorKind.IMAGE_NOT_FOUND),
        (r"pull access denied|unauthorized|permission denied", ErrorKind.PERMISSION_DENIED),
        (r"no space left on device", ErrorKind.DISK_PRESSURE),
        (r"range of cpus", ErrorKind.RESOURCE_LIMIT_EXCEEDED),
        (r"could not select device driver|nvidia-container", ErrorKind.CONTAINER_RUNTIME_ERROR),
        (
            r"executable file not found|no such file or directory|bind source path|not a directory",
            ErrorKind.INVALID_CONFIG,
        ),
        (r"timeout|i/o timeout|tls handshake", ErrorKind.NETWORK_TIMEOUT),
    )
)

DEFAULT_VENDOR_DEVICES: Mapping[str, Sequence[str]] = {"amd": ("/dev/kfd", "/dev/dri")}


def classify_api_error(exc: docker.errors.DockerException) -> ErrorKind:
    """Map an engine error to the retry classifier's vocabulary."""
    if isinstance(exc, docker.errors.ImageNotFound):
        return ErrorKind.IMAGE_NOT_FOUND
    text = str(exc)
    for pattern, kind in _API_ERRORS:
        if pattern.search(text):
            return kind
    status = getattr(exc, "status_code", None)
    if status == 403:
        return ErrorKind.PERMISSION_DENIED
    if isinstance(status, int) and 400 <= status < 500:
        return ErrorKind.INVALID_CONFIG
    return ErrorKind.CONTAINER_RUNTIME_ERROR


def _parse_docker_time(value: str | None) -> datetime:
    """Docker timestamps carry nanoseconds; Python keeps microseconds."""
    if not value or value.startswith("0001-"):
        return datetime.now(UTC)
    m = re.match(r"^(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", value)
    if not m:
        return datetime.now(UTC)
    base, frac, tz = m.groups()
    text = base + (f".{(frac or '0')[:6]:0<6}") + ("+00:00" if tz == "Z" else tz)
    return datetime.fromisoformat(text).astimezone(UTC)


class DockerRuntime(Runtime):
    name: ClassVar[str] = "docker"

    def __init__(
        self,
        client: docker.DockerClient | None = None,
        *,
        pull: bool = False,
        init: bool = True,
        pids_limit: int = 4096,
        shm_size_mb: int | None = None,
        log_max_size: str | None = "100m",
        vendor_devices: Mapping[str, Sequence[str]] = DEFAULT_VENDOR_DEVICES,
        max_threads: int = 64,
        wait_poll_s: float = 5.0,
        owner: str | None = None,
        user: str | None = None,
        root_tenants: frozenset[str] = frozenset(),
        capabilities: Sequence[str] = KEPT_CAPABILITIES,
        read_only_root: bool = False,
        tmp_size_mb: int = 256,
        nofile: int = 16384,
        isolation: str = "docker",
        tenant_networks: bool = True,
        installation: str | None = None,
        mps: MpsDaemon | None = None,
        nvml: Any | None = None,
    ) -> None:
        """`pull`: fetch a missing image from its registry (off: a missing image is
        `ImageNotFound` at once). `init`: run docker-init as PID 1 so `stop`'s SIGTERM reaches
        the task and zombies are reaped. `wait_poll_s`: how long one blocking wait call lasts
        before it is re-issued, which bounds how long a cancelled `wait` keeps a thread.
        `owner`: only containers labelled `heteroflow.node=<owner>` are listed (re-adopted),
        so agents sharing one engine never take each other's containers. `user`: a uid:gid forced
        on tenant containers (None: the image's user), except for `root_tenants`, which keep
        the image's. `capabilities`: those a container running as the image's user keeps
        (every other one is dropped; a forced uid keeps none). `read_only_root`:
        the root filesystem read-only, with a `tmp_size_mb` tmpfs on /tmp. `nofile`: the
        open-files limit. `tenant_networks`: one network per tenant, kept apart as
        `isolation` says (networks.py). `installation`: the
        same for the platform installation's id (label `heteroflow.installation`), so two
        installations whose nodes share a name and an engine never adopt each other's.
        `mps`: the node's MPS control daemon for silver fractions; `nvml`: a stand-in NVML
        for tests (sharing.py)."""
        self._client = client
        self.mps = mps or MpsDaemon()
        self.nvml = nvml
        self.owner = owner
        self.installation = installation
        self.pull = pull
        self.init = init
        self.pids_limit = pids_limit
        self.shm_size_mb = shm_size_mb
        self.log_max_size = log_max_size
        self.vendor_devices = vendor_devices
        self.wait_poll_s = wait_poll_s
        self.user = user
        self.root_tenants = root_tenants
        self.capabilities = tuple(capabilities)
        self._userns: bool | None = None
        self.read_only_root = read_only_root
        self.tmp_size_mb = tmp_size_mb
        self.nofile = nofile
        self.isolation = isolation
        self.tenant_networks = tenant_networks
        self._networks: TenantNetworks | None = None
        self._networks_lock = threading.Lock()
        self._max_threads = max_threads
        self._executor = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="hf-docker")
        # The waits on running containers: abandoned at exit, not waited for (daemon_threads).
        self._waits = DaemonThreads(max_threads, "hf-docker-wait")

    # -- plumbing -------------------------------------------------------------------------

    @classmethod
    def available(cls, timeout_s: float = 3.0) -> bool:
        """True when a Docker engine answers a ping (DOCKER_HOST or the default socket)."""
        try:
            client = docker.from_env(timeout=max(1, math.ceil(timeout_s)))
        except docker.errors.DockerException:
            return False
        try:
            return bool(client.ping())
        except (docker.errors.DockerException, requests.RequestException):
            return False
        finally:
            client.close()

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            try:
                self._client = docker.from_env(max_pool_size=self._max_threads)
            except docker.errors.DockerException as e:
                raise RuntimeFault(f"docker engine unavailable: {e}") from e
        return self._client

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, partial(fn, *args, **kwargs))

    def _container(self, handle: Handle) -> Container:
        try:
            return self.client.containers.get(handle.id)
        except docker.errors.NotFound as e:
            raise HandleNotFound(handle) from e
        except docker.errors.DockerException:
            raise
        except requests.RequestException as e:  # engine gone (socket refused, reset)
            raise RuntimeFault(f"docker engine unreachable: {e}") from e

    def userns_remap(self) -> bool:
        """Whether dockerd remaps user namespaces (`--userns-remap`): root in a container is
        then an unprivileged uid on the host. Blocking; asked once."""
        if self._userns is None:
            try:
                options = self.client.info().get("SecurityOptions") or []
            except (RuntimeFault, docker.errors.DockerException, requests.RequestException) as e:
                log.warning("docker info failed; user namespaces reported off", error=str(e))
                return False
            self._userns = any("name=userns" in str(o) for o in options)
        return self._userns

    def node_facts(self) -> dict[str, Any]:
        return {"userns_remap": self.userns_remap()}

    async def close(self) -> None:
        if self._networks is not None and self.installation:
            # Tenant networks outlive nothing that is gone: the engine's address pools are
            # finite (about 30 bridges by default), and each installation has its own.
            try:
                await asyncio.wait_for(
                    self._run(
                        networks_prune, self.client, self.installation, self._networks.isolation
                    ),
                    timeout=10.0,
                )
            except (TimeoutError, RuntimeFault, docker.errors.DockerException) as exc:
                log.warning("tenant_networks_not_pruned", error=str(exc))
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._waits.shutdown()
        if self._client is not None:
            self._client.close()

    # -- start ----------------------------------------------------------------------------

    def _create_kwargs(self, spec: RunSpec, mig: MigInstance | None = None) -> dict[str, Any]:
        mem = f"{spec.memory_mb}m"
        env = {
            **spec.env,
            "HETEROFLOW_TASK_ID": spec.task_id,
            "HETEROFLOW_ATTEMPT": str(spec.attempt),
        }
        kwargs: dict[str, Any] = {
            "image": spec.image,
            "name": spec.name,
            "labels": spec.managed_labels() | self._installation_label(),
            "environment": env,
            "detach": True,
            "restart_policy": {"Name": "no"},
            "mem_limit": mem,
            "memswap_limit": mem,  # equal to the limit: no swap, so exceeding it is an OOM kill
            "nano_cpus": max(1, round(spec.cpu_cores * 1e9)),
            "pids_limit": self.pids_limit,
            "security_opt": ["no-new-privileges"],
            "cap_drop": ["ALL"],  # _harden adds back the kept ones
            "privileged": False,
            "init": self.init,
            "mounts": [
                Mount(
                    target=v.container_path, source=v.host_path, type="bind", read_only=v.read_only
                )
                for v in spec.volumes
            ],
        }
        self._harden(spec, kwargs)
        if spec.serve_port:
            # A free host port on the node's address; `endpoint` reads which one was given.
            kwargs["ports"] = {f"{spec.serve_port}/tcp": (spec.serve_host, None)}
        if spec.command:
            # Like Kubernetes `command`: the shell replaces the image's entrypoint.
            kwargs["entrypoint"] = ["/bin/sh", "-c"]
            kwargs["command"] = [spec.command]
        if self.shm_size_mb:
            kwargs["shm_size"] = f"{self.shm_size_mb}m"
        if self.log_max_size:
            kwargs["log_config"] = LogConfig(
                type="json-file", config={"max-size": self.log_max_size, "max-file": "3"}
            )
        self._gpus(spec, kwargs, env, mig)
        return kwargs

    def _gpus(
        self, spec: RunSpec, kwargs: dict[str, Any], env: dict[str, str], mig: MigInstance | None
    ) -> None:
        """The cards the container sees, and how a fraction of one is held (sharing.py)."""
        vendor = spec.gpu_vendor.lower()
        if spec.gpu_ids and vendor == "nvidia":
            ids = [mig.uuid] if mig is not None else list(spec.gpu_ids)
            kwargs["device_requests"] = [DeviceRequest(device_ids=ids, capabilities=[["gpu"]])]
            if mig is not None:
                kwargs["labels"][LABEL_MIG] = mig.uuid
            elif spec.qos == SILVER:
                pipe = self.mps.pipe_dir
                env.update(mps_env(spec.gpu_memory_mb, spec.gpu_compute_ratio, pipe))
                kwargs["mounts"].append(Mount(target=pipe, source=pipe, type="bind"))
                kwargs["ipc_mode"] = "host"  # MPS clients share the daemon's IPC namespace
        elif spec.gpu_ids and vendor in self.vendor_devices:
            # No device plugin for these vendors: pass the device nodes, restrict by env.
            # A fraction here is bronze: accounted for by the scheduler, enforced by nothing.
            kwargs["devices"] = [f"{d}:{d}:rwm" for d in self.vendor_devices[vendor]]
            env.update(gpu_visibility_env(vendor, spec.gpu_ids))

    def _share_sync(self, spec: RunSpec) -> MigInstance | None:
        """Before a fraction's container is created: its MIG instance (gold), or the MPS
        daemon running (silver). Blocking."""
        if not spec.gpu_ids or spec.gpu_vendor.lower() != "nvidia":
            return None
        if spec.qos == SILVER:
            self.mps.ensure()
        if spec.qos != GOLD:
            return None
        card = spec.gpu_ids[0]
        # The low-level list: `containers.list` inspects each one, and a container removed
        # between the list and its inspection would fail this start with a NotFound.
        taken = {
            str((c.get("Labels") or {}).get(LABEL_MIG, ""))
            for c in self.client.api.containers(all=True, filters={"label": LABEL_MIG})
            if c.get("State") in ("created", "running", "restarting", "paused")
            and f"/{spec.name}" not in (c.get("Names") or ())
        }
        mig = choose_mig(mig_instances(card, self.nvml), spec.gpu_memory_mb, taken)
        if mig is None:
            raise RuntimeStartError(
                ErrorKind.CONTAINER_RUNTIME_ERROR,
                f"no free MIG instance with {spec.gpu_memory_mb} MB on card {card} "
                "(gold fractions run on an instance the operator created)",
            )
        return mig

    def _harden(self, spec: RunSpec, kwargs: dict[str, Any]) -> None:
        """User, capabilities, root filesystem and open files: the node's defaults."""
        if self.user and spec.tenant_id not in self.root_tenants:
            kwargs["user"] = self.user  # a forced uid: every capability stays dropped
        elif self.capabilities:
            kwargs["cap_add"] = list(self.capabilities)
        if self.read_only_root:
            kwargs["read_only"] = True
            kwargs["tmpfs"] = {"/tmp": f"rw,nosuid,nodev,size={self.tmp_size_mb}m,mode=1777"}
        kwargs["ulimits"] = [Ulimit(name="nofile", soft=self.nofile, hard=self.nofile)]

    def _network_sync(self, spec: RunSpec) -> dict[str, Any]:
        """The tenant's network (created on first use), as create arguments; a static-world
        member shares the host's network instead (`network_mode: host`, no port published:
        its ports are the host's, allocated by the scheduler; docs/groups.md)."""
        if spec.host_network:
            return {"network_mode": "host", "ports": None}
        if not self.tenant_networks:
            return {}
        try:
            with self._networks_lock:  # one TenantNetworks (and one lock) for every start
                if self._networks is None:
                    self._networks = TenantNetworks(
                        self.client, self.isolation, self.installation or ""
                    )
            return {"network": self._networks.ensure(spec.tenant_id)}
        except (RuntimeFault, docker.errors.DockerException) as e:
            # Never start a tenant's container outside its network: the start fails instead.
            raise RuntimeStartError(ErrorKind.CONTAINER_RUNTIME_ERROR, str(e)) from e

    def _pull_sync(self, image: str) -> None:
        try:
            self.client.images.pull(image)
        except docker.errors.DockerException as e:
            kind = classify_api_error(e)
            if kind not in (ErrorKind.IMAGE_NOT_FOUND, ErrorKind.PERMISSION_DENIED):
                kind = ErrorKind.IMAGE_PULL_BACK_OFF
            raise RuntimeStartError(kind, f"pulling {image}: {e}") from e
        except requests.RequestException as e:
            raise RuntimeStartError(ErrorKind.NETWORK_TIMEOUT, f"pulling {image}: {e}") from e

    def _create_sync(self, spec: RunSpec) -> Container:
        kwargs = self._create_kwargs(spec, self._share_sync(spec)) | self._network_sync(spec)
        try:
            return self.client.containers.create(**kwargs)
        except docker.errors.ImageNotFound as e:
            if not self.pull:
                raise RuntimeStartError(
                    ErrorKind.IMAGE_NOT_FOUND, f"{spec.image} is not on this node (pull disabled)"
                ) from e
        except docker.errors.APIError as e:
            if e.status_code == 409:
                return self._existing_sync(spec, e)
            raise RuntimeStartError(classify_api_error(e), str(e)) from e
        self._pull_sync(spec.image)
        try:
            return self.client.containers.create(**kwargs)
        except docker.errors.APIError as e:
            raise RuntimeStartError(classify_api_error(e), str(e)) from e

    def _existing_sync(self, spec: RunSpec, conflict: Exception) -> Container:
        """Idempotency guard: a redelivered start of the same attempt returns the container
        that attempt already has (running or ended) instead of running the work twice."""
        try:
            existing = self.client.containers.get(spec.name)
        except docker.errors.NotFound as e:  # removed between create and get
            raise RuntimeStartError(ErrorKind.TRANSIENT_ERROR, str(conflict)) from e
        labels = existing.labels
        if (
            labels.get(LABEL_TASK_ID) != spec.task_id
            or labels.get(LABEL_ATTEMPT) != str(spec.attempt)
            or labels.get(LABEL_INSTALLATION) != self.installation
        ):
            raise RuntimeStartError(
                ErrorKind.INVALID_CONFIG, f"name {spec.name} is taken by another container"
            )
        return existing

    def _installation_label(self) -> dict[str, str]:
        return {LABEL_INSTALLATION: self.installation} if self.installation else {}

    def _start_created(self, container: Container) -> None:
        try:
            container.start()
        except docker.errors.APIError as e:
            try:  # a container that never ran holds nothing worth keeping
                container.remove(force=True)
            except docker.errors.DockerException:
                log.warning("could not remove a container that failed to start", id=container.id)
            raise RuntimeStartError(classify_api_error(e), str(e)) from e

    def _create_started(self, spec: RunSpec) -> tuple[Container, bool]:
        """The attempt's container, started; and whether it was made now (False: a
        redelivered start found it)."""
        container = self._create_sync(spec)
        fresh = container.status == "created"
        if fresh:
            self._start_created(container)
        return container, fresh

    def _tenant_network_gone(self, spec: RunSpec) -> bool:
        if spec.host_network or self._networks is None:
            return False
        try:
            return self._networks.forget_if_gone(spec.tenant_id)
        except docker.errors.DockerException:
            return False

    def _start_sync(self, spec: RunSpec) -> Handle:
        if not spec.image:
            # The scheduler places image-less tasks on process nodes only; this is the guard
            # behind it (an old scheduler, a node whose runtime changed).
            raise RuntimeStartError(
                ErrorKind.INVALID_CONFIG,
                "the task has no image: it runs only on a node with the process runtime",
            )
        try:
            try:
                container, fresh = self._create_started(spec)
            except RuntimeStartError:
                if not self._tenant_network_gone(spec):
                    raise
                # Removed while idle by another agent of this installation on this engine
                # (its close prunes): made again, once.
                container, fresh = self._create_started(spec)
        except RuntimeStartError:
            raise
        except (RuntimeFault, docker.errors.DockerException, requests.RequestException) as e:
            raise RuntimeStartError(ErrorKind.CONTAINER_RUNTIME_ERROR, f"engine: {e}") from e
        log.info(
            "container started" if fresh else "container already exists",
            task_id=spec.task_id,
            attempt=spec.attempt,
            container=container.id,
        )
        return Handle(
            runtime=self.name, id=container.id, task_id=spec.task_id, attempt=spec.attempt
        )

    async def start(self, spec: RunSpec) -> Handle:
        return await self._run(self._start_sync, spec)

    # -- wait and report ------------------------------------------------------------------

    def _wait_once(self, handle: Handle) -> bool:
        """Block up to `wait_poll_s`; True once the container has ended."""
        container = self._container(handle)
        # "created": it never ran (an agent died between create and start); waiting would
        # either hang or, with the engine's default condition, fake an exit code of 0.
        if container.status in ("exited", "dead", "created"):
            return True
        try:
            container.wait(timeout=self.wait_poll_s)
            return True
        except docker.errors.NotFound as e:
            raise HandleNotFound(handle) from e
        except docker.errors.DockerException:
            raise
        except requests.RequestException:  # the read timed out: still running
            return False

    def _report_sync(self, handle: Handle) -> ExitReport:
        container = self._container(handle)
        state = container.attrs.get("State", {})
        if container.status == "created":
            return ExitReport(
                exit_code=None,
                error=f"{ErrorKind.CONTAINER_RUNTIME_ERROR.value}: created but never started",
            )
        exit_code = int(state.get("ExitCode", -1))
        # On cgroup v1 OOMKilled is set when *any* process in the container was OOM-killed,
        # even one whose parent carried on and exited 0; only a failed exit counts as an OOM.
        oom = bool(state.get("OOMKilled")) and exit_code != 0
        engine_error = state.get("Error") or None
        tail = split_output(container.logs(stdout=True, stderr=True, tail=OUTPUT_TAIL_LINES))
        return ExitReport(
            exit_code=exit_code,
            oom_killed=oom,
            error=f"{ErrorKind.CONTAINER_RUNTIME_ERROR.value}: {engine_error}"
            if engine_error
            else None,
            output_tail=tail[-OUTPUT_TAIL_LINES:],
            finished_at=_parse_docker_time(state.get("FinishedAt")),
        )

    async def wait(self, handle: Handle) -> ExitReport:
        while not await asyncio.wrap_future(self._waits.submit(partial(self._wait_once, handle))):
            pass
        return await self._run(self._report_sync, handle)

    # -- control --------------------------------------------------------------------------

    def _stop_sync(self, handle: Handle, grace_s: float) -> None:
        container = self._container(handle)
        # The engine stops a paused container correctly (it thaws it to deliver the kill).
        container.stop(timeout=max(0, math.ceil(grace_s)))
        log.info("container stopped", task_id=handle.task_id, attempt=handle.attempt)

    async def stop(self, handle: Handle, grace_s: float = 10.0) -> None:
        await self._run(self._stop_sync, handle, grace_s)

    def _toggle_pause_sync(self, handle: Handle, pause: bool) -> None:
        container = self._container(handle)
        try:
            if pause:
                container.pause()
            else:
                container.unpause()
        except docker.errors.APIError as e:
            # Engines disagree on the status of "already paused" / "not paused" (409 or 500):
            # judge by the container's state instead.
            container.reload()
            target = "paused" if pause else "running"
            if container.status == target:
                return
            if container.status in ("running", "paused"):
                raise RuntimeFault(str(e)) from e
            raise InvalidOperation(
                f"cannot {'pause' if pause else 'unpause'} a {container.status} container"
            ) from e

    async def pause(self, handle: Handle) -> None:
        await self._run(self._toggle_pause_sync, handle, True)

    async def unpause(self, handle: Handle) -> None:
        await self._run(self._toggle_pause_sync, handle, False)

    def _remove_sync(self, handle: Handle) -> None:
        try:
            self.client.containers.get(handle.id).remove(force=True, v=True)
        except docker.errors.NotFound:
            return

    async def remove(self, handle: Handle) -> None:
        await self._run(self._remove_sync, handle)

    def _endpoint_sync(self, handle: Handle, spec: RunSpec) -> str:
        if spec.host_network:
            return f"{spec.serve_host}:{spec.serve_port}"  # the host's own port, not mapped
        container = self._container(handle)
        ports = (container.attrs.get("NetworkSettings") or {}).get("Ports") or {}
        for binding in ports.get(f"{spec.serve_port}/tcp") or ():
            if binding.get("HostPort"):
                return f"{spec.serve_host}:{binding['HostPort']}"
        return ""

    async def endpoint(self, handle: Handle, spec: RunSpec) -> str:
        if not spec.serve_port:
            return ""
        return await self._run(self._endpoint_sync, handle, spec)

    # -- observe --------------------------------------------------------------------------

    def _logs_sync(self, handle: Handle, tail: int | None) -> list[str]:
        if tail is not None and tail <= 0:
            return []
        container = self._container(handle)
        data = container.logs(stdout=True, stderr=True, tail="all" if tail is None else tail)
        return split_output(data)

    async def logs(self, handle: Handle, tail: int | None = None) -> list[str]:
        return await self._run(self._logs_sync, handle, tail)

    async def follow_logs(
        self, handle: Handle, tail: int | None = None
    ) -> AsyncGenerator[str, None]:
        container = await self._run(self._container, handle)
        stream = await self._run(
            container.logs,
            stdout=True,
            stderr=True,
            stream=True,
            follow=True,
            tail="all" if tail is None else max(0, tail),
        )
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()

        def pump() -> None:
            # Runs in a pool thread; ends when the container ends or `stream.close()` is called.
            try:
                for chunk in stream:
                    loop.call_soon_threadsafe(queue.put_nowait, chunk)
            except Exception as e:  # noqa: BLE001 - a broken stream just ends the follow
                log.debug("log stream ended", error=str(e))
            finally:
                with contextlib.suppress(RuntimeError):  # the loop may be closed already
                    loop.call_soon_threadsafe(queue.put_nowait, None)

        pump_done = loop.run_in_executor(self._executor, pump)
        lines = LineAssembler()
        anchor = b""
        try:
            while (chunk := await queue.get()) is not None:
                anchor = (anchor + chunk)[-4096:]
                for line in lines.feed(chunk):
                    yield line
            missed = await self._run(self._missed_sync, container, anchor, tail is None)
            for line in lines.feed(missed) + lines.flush():
                yield line
        finally:
            stream.close()
            pump_done.cancel()

    def _missed_sync(self, container: Container, anchor: bytes, everything: bool) -> bytes:
        """Output the follow stream never delivered. The engine can end a follow as the
        container exits, before its last output (notably a final line without a newline) is
        written; take it from the stored log, after the last bytes the stream did deliver."""
        container.reload()
        if container.status not in ("exited", "dead"):
            return b""  # the stream broke, the container did not end: nothing to infer
        if not anchor:
            return container.logs(stdout=True, stderr=True) if everything else b""
        recent = container.logs(stdout=True, stderr=True, tail=1000)
        at = recent.rfind(anchor)
        return recent[at + len(anchor) :] if at >= 0 else b""

    def _inspect_sync(self, handle: Handle) -> RunState:
        try:
            container = self.client.containers.get(handle.id)
        except docker.errors.NotFound:
            return RunState.MISSING
        return _STATES.get(container.status, RunState.RUNNING)

    async def inspect(self, handle: Handle) -> RunState:
        return await self._run(self._inspect_sync, handle)

    def _list_sync(self) -> list[Handle]:
        labels = [f"{LABEL_MANAGED}=true"]
        if self.owner:
            labels.append(f"{LABEL_NODE}={self.owner}")
        if self.installation:
            labels.append(f"{LABEL_INSTALLATION}={self.installation}")
        # The low-level list: one call. `containers.list` inspects each container after
        # listing, and fails with NotFound when one is removed in between.
        found = self.client.api.containers(all=True, filters={"label": labels})
        handles = []
        for c in found:
            tags = c.get("Labels") or {}
            try:
                attempt = int(tags.get(LABEL_ATTEMPT, ""))
            except ValueError:
                continue
            task_id = tags.get(LABEL_TASK_ID)
            if task_id:
                handles.append(
                    Handle(runtime=self.name, id=c["Id"], task_id=task_id, attempt=attempt)
                )
        return handles

    async def list_managed(self) -> list[Handle]:
        return await self._run(self._list_sync)
