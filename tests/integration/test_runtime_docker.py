"""The docker runtime against a real engine (skipped when none answers; see .ci/setup-docker.sh).

Uses the locally built `busybox:latest`; no registry is involved.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
import requests

from agent.runtimes import choose_runtime_kind, create_runtime
from agent.runtimes.base import (
    LABEL_ATTEMPT,
    LABEL_MANAGED,
    LABEL_TASK_ID,
    ErrorKind,
    Handle,
    LineAssembler,
    RunSpec,
    RunState,
    Runtime,
    RuntimeStartError,
)
from agent.runtimes.docker import DockerRuntime, _parse_docker_time, classify_api_error
from agent.runtimes.process import ProcessRuntime
from agent.runtimes.simulated import SimulatedRuntime
from tests.contract.runtime import RuntimeContract, shell_script, split_behaviour

pytestmark = [pytest.mark.integration, pytest.mark.docker]

IMAGE = "busybox:latest"
RUN = uuid.uuid4().hex[:8]  # this test run's task-id prefix, for cleanup


@pytest.fixture(scope="module")
def engine() -> Iterator[docker.DockerClient]:
    if not DockerRuntime.available():
        pytest.skip("no Docker engine answers (run .ci/setup-docker.sh as root to start one)")
    client = docker.from_env()
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        pytest.skip(f"{IMAGE} is not built (run .ci/setup-docker.sh)")
    yield client
    for c in client.containers.list(all=True, filters={"label": f"{LABEL_MANAGED}=true"}):
        if c.labels.get(LABEL_TASK_ID, "").startswith(f"d{RUN}"):
            c.remove(force=True)
    client.close()


def spec(command: str, **kw: object) -> RunSpec:
    return RunSpec.model_validate(
        {
            "task_id": f"d{RUN}-{uuid.uuid4().hex[:8]}",
            "attempt": 0,
            "image": IMAGE,
            "command": command,
            "memory_mb": 64,
            "cpu_cores": 0.5,
            **kw,
        }
    )


def container(engine: docker.DockerClient, h: Handle) -> dict[str, Any]:
    attrs: dict[str, Any] = engine.containers.get(h.id).attrs
    return attrs


class TestDockerRuntime(RuntimeContract):
    @pytest.fixture(autouse=True)
    def _engine(self, engine: docker.DockerClient) -> None:
        self.engine = engine  # skips the class when no engine answers

    def make_runtime(self, tmp_path: Path) -> Runtime:
        return DockerRuntime(wait_poll_s=1.0)

    def make_restarted(self, rt: Runtime) -> Runtime:
        return DockerRuntime(wait_poll_s=1.0)

    def spec(self, prints: Sequence[str] = (), **kw: Any) -> RunSpec:
        script, fields = split_behaviour(kw)
        return spec(shell_script(prints, **script), **fields)

    def missing_image(self) -> str:
        return f"heteroflow/absent-{RUN}:latest"

    async def frozen(self, rt: Runtime, h: Handle) -> bool:
        return bool(container(self.engine, h)["State"]["Paused"])

    async def dispose(self, rt: Runtime) -> None:
        for h in await rt.list_managed():  # the engine is shared: only this run's containers
            if h.task_id.startswith(f"d{RUN}"):
                await rt.remove(h)
        await rt.close()

    # -- the docker runtime's own cases ---------------------------------------------------

    async def test_stderr_is_kept_beside_stdout(self, rt: DockerRuntime) -> None:
        h = await rt.start(spec("echo to-stderr >&2; sleep 0.2; echo hello; echo world"))
        report = await rt.wait(h)
        # stdout and stderr are copied separately by the engine: their relative order may vary
        assert sorted(report.output_tail) == ["hello", "to-stderr", "world"]
        assert "to-stderr" in await rt.logs(h)

    async def test_memory_limit_is_an_oom_kill(self, rt: DockerRuntime) -> None:
        # The shell itself holds 200 MB in a variable: with 32 MB it is the OOM killer's victim.
        h = await rt.start(
            spec('x=$(head -c 200000000 /dev/zero | tr "\\0" a); echo done', memory_mb=32)
        )
        report = await rt.wait(h)
        assert report.exit_code == 137
        assert report.oom_killed
        assert container(self.engine, h)["State"]["OOMKilled"] is True

    async def test_a_killed_child_does_not_make_a_successful_task_an_oom(
        self, rt: DockerRuntime
    ) -> None:
        # `tail` is OOM-killed, the shell carries on and exits 0. On cgroup v1 the engine still
        # says OOMKilled; the report does not, since the task as a whole succeeded.
        h = await rt.start(
            spec("tail -c 200000000 /dev/zero >/dev/null; echo survived", memory_mb=32)
        )
        report = await rt.wait(h)
        assert report.exit_code == 0 and not report.oom_killed
        # The shell's "Killed" notice (stderr) and "survived" (stdout) are copied by the engine
        # separately, so their order in the log is not fixed.
        assert "survived" in report.output_tail

    async def test_missing_image_with_pull_enabled_is_still_classified(self) -> None:
        rt = DockerRuntime(pull=True)
        try:
            with pytest.raises(RuntimeStartError) as err:
                # a registry that cannot exist: fails fast, whatever the network allows
                await rt.start(spec("true", image=f"localhost:1/absent-{RUN}:latest"))
            assert err.value.kind in (
                ErrorKind.IMAGE_PULL_BACK_OFF,
                ErrorKind.IMAGE_NOT_FOUND,
                ErrorKind.NETWORK_TIMEOUT,
            )
        finally:
            await rt.close()

    async def test_a_never_started_container_reports_no_exit_code(self, rt: DockerRuntime) -> None:
        s = spec("echo never")
        await asyncio.to_thread(rt._create_sync, s)  # as if the agent died between create/start
        [h] = [x for x in await rt.list_managed() if x.task_id == s.task_id]
        assert await rt.inspect(h) is RunState.CREATED
        report = await asyncio.wait_for(rt.wait(h), 5)
        assert report.exit_code is None and not report.succeeded
        assert report.error is not None and "never started" in report.error
        assert await rt.start(s) == h  # a redelivered start runs it after all
        assert (await rt.wait(h)).output_tail == ["never"]

    async def test_security_and_limits(self, rt: DockerRuntime) -> None:
        s = spec(
            "id -u; touch /tmp/f; chown 1 /tmp/f && echo chowned; "
            "mknod /tmp/n c 1 3 2>/dev/null || echo mknod-refused",
            labels={"team": "x"},
        )
        h = await rt.start(s)
        report = await rt.wait(h)
        # The image's user (root in busybox) with the kept capabilities (test_container_hardening)
        assert report.output_tail == ["0", "chowned", "mknod-refused"]
        attrs = container(self.engine, h)
        assert attrs["Config"]["User"] == ""
        host = attrs["HostConfig"]
        assert host["CapDrop"] == ["ALL"] and "MKNOD" not in host["CapAdd"]
        assert host["SecurityOpt"] == ["no-new-privileges"]
        assert host["Privileged"] is False
        assert host["Memory"] == host["MemorySwap"] == 64 * 1024 * 1024
        assert host["NanoCpus"] == 500_000_000
        assert host["PidsLimit"] == 4096
        assert host["RestartPolicy"]["Name"] in ("no", "")
        assert host["AutoRemove"] is False
        assert attrs["Name"] == f"/hf-{s.task_id}-0"
        labels = attrs["Config"]["Labels"]
        assert labels[LABEL_MANAGED] == "true" and labels[LABEL_TASK_ID] == s.task_id
        assert labels[LABEL_ATTEMPT] == "0" and labels["team"] == "x"

    async def test_env_and_read_only_volume(self, rt: DockerRuntime, tmp_path: Path) -> None:
        (tmp_path / "in.txt").write_text("payload\n")
        os.chmod(tmp_path, 0o755)  # readable by whatever uid the container runs as
        s = spec(
            'echo "$GREETING"; cat /data/in.txt; touch /data/x 2>/dev/null || echo read-only',
            env={"GREETING": "hi there"},
            volumes=[{"host_path": str(tmp_path), "container_path": "/data", "read_only": True}],
        )
        report = await rt.wait(await rt.start(s))
        assert report.output_tail == ["hi there", "payload", "read-only"]


# -- pure: request building and error mapping (no engine needed) -----------------------------


def test_nvidia_gpus_become_a_device_request() -> None:
    rt = DockerRuntime(client=object())
    kw = rt._create_kwargs(spec("nvidia-smi", gpu_ids=("GPU-a", "GPU-b"), gpu_vendor="nvidia"))
    [req] = kw["device_requests"]
    assert req["DeviceIDs"] == ["GPU-a", "GPU-b"] and req["Capabilities"] == [["gpu"]]
    assert "CUDA_VISIBLE_DEVICES" not in kw["environment"]
    assert kw["entrypoint"] == ["/bin/sh", "-c"] and kw["command"] == ["nvidia-smi"]
    assert "device_requests" not in rt._create_kwargs(spec("true"))
    assert "device_requests" not in rt._create_kwargs(spec("true", gpu_vendor="nvidia"))


def test_other_vendors_get_device_nodes_and_visibility_env() -> None:
    rt = DockerRuntime(client=object())
    kw = rt._create_kwargs(spec("rocm-smi", gpu_ids=("1",), gpu_vendor="amd"))
    assert kw["devices"] == ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"]
    assert kw["environment"]["ROCR_VISIBLE_DEVICES"] == "1"
    assert "device_requests" not in kw


def test_empty_command_keeps_the_image_entrypoint() -> None:
    kw = DockerRuntime(client=object())._create_kwargs(spec(""))
    assert "entrypoint" not in kw and "command" not in kw


def api_error(status: int, explanation: str) -> docker.errors.APIError:
    response = requests.Response()
    response.status_code = status
    response.url = "http+docker://localhost/v1.41/containers/create"
    response.reason = "Error"
    return docker.errors.APIError(explanation, response=response, explanation=explanation)


@pytest.mark.parametrize(
    ("status", "message", "kind"),
    [
        (404, "No such image: x:1", ErrorKind.IMAGE_NOT_FOUND),
        (500, "pull access denied for x, repository does not exist", ErrorKind.IMAGE_NOT_FOUND),
        (401, "unauthorized: authentication required", ErrorKind.PERMISSION_DENIED),
        (403, "forbidden", ErrorKind.PERMISSION_DENIED),
        (
            400,
            "Range of CPUs is from 0.01 to 2.00, as there are only 2 CPUs available",
            ErrorKind.RESOURCE_LIMIT_EXCEEDED,
        ),
        (400, 'exec: "/bin/sh": stat /bin/sh: no such file or directory', ErrorKind.INVALID_CONFIG),
        (
            400,
            "invalid mount config for type bind: bind source path does not exist",
            ErrorKind.INVALID_CONFIG,
        ),
        (
            500,
            'could not select device driver "" with capabilities: [[gpu]]',
            ErrorKind.CONTAINER_RUNTIME_ERROR,
        ),
        (500, "write /var/lib/docker/x: no space left on device", ErrorKind.DISK_PRESSURE),
        (500, "Get https://r/v2/: net/http: TLS handshake timeout", ErrorKind.NETWORK_TIMEOUT),
        (400, "something else", ErrorKind.INVALID_CONFIG),
        (500, "daemon hiccup", ErrorKind.CONTAINER_RUNTIME_ERROR),
    ],
)
def test_classify_api_error(status: int, message: str, kind: ErrorKind) -> None:
    assert classify_api_error(api_error(status, message)) is kind


@pytest.mark.parametrize(
    ("value", "iso"),
    [
        ("2026-11-29T07:51:01.679375123Z", "2026-11-29T07:51:01.679375+00:00"),
        ("2026-11-29T07:51:01Z", "2026-11-29T07:51:01+00:00"),
        ("2026-11-29T09:51:01.5+02:00", "2026-11-29T07:51:01.500000+00:00"),
    ],
)
def test_parse_docker_time(value: str, iso: str) -> None:
    assert _parse_docker_time(value).isoformat() == iso


def test_line_assembler_joins_split_chunks() -> None:
    lines = LineAssembler()
    assert lines.feed(b"par") == []
    assert lines.feed(b"tial\nwhole\n\nnext") == ["partial", "whole", ""]
    assert lines.feed("é".encode()[:1]) == []
    assert lines.feed("é".encode()[1:] + b"\n") == ["nexté"]
    assert lines.flush() == []
    assert lines.feed(b"tail") == [] and lines.flush() == ["tail"]


@pytest.mark.parametrize(
    ("configured", "engine", "kind"),
    [
        ("auto", True, "docker"),
        ("auto", False, "process"),
        ("docker", False, "docker"),
        ("process", True, "process"),
        ("simulated", True, "simulated"),
    ],
)
def test_runtime_choice(configured: str, engine: bool, kind: str) -> None:
    assert choose_runtime_kind(configured, lambda: engine) == kind


def test_unknown_runtime_is_refused() -> None:
    with pytest.raises(ValueError):
        choose_runtime_kind("podman")


def test_create_runtime(tmp_path: Path) -> None:
    rt = create_runtime("auto", state_dir=tmp_path, docker_answers=lambda: False)
    assert isinstance(rt, ProcessRuntime) and rt.tasks_dir == tmp_path / "tasks"
    sim = create_runtime("simulated", state_dir=tmp_path, simulated_options={"node_id": "n9"})
    assert isinstance(sim, SimulatedRuntime) and sim.node_id == "n9"
    dock = create_runtime("docker", state_dir=tmp_path, docker_options={"pull": True})
    assert isinstance(dock, DockerRuntime) and dock.pull
