"""Where the process runtime makes task cgroups, from /proc/self/mounts and /proc/self/cgroup
texts and a directory tree standing in for v1 hierarchies (real hierarchies:
tests/integration/test_runtime_process_cgroups.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.runtimes import cgroups

HYBRID_MOUNTS = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
HYBRID_OWN = """\
9:name=systemd:/system.slice/agent.service
8:pids:/system.slice/agent.service
4:memory:/box/1
2:cpu,cpuacct:/
0::/system.slice/agent.service
"""


def test_the_mounts_and_the_agents_own_cgroups_are_read() -> None:
    unified, v1 = cgroups._mounts(HYBRID_MOUNTS)
    assert unified == Path("/sys/fs/cgroup/unified")
    assert v1 == {
        "cpu": Path("/sys/fs/cgroup/cpu,cpuacct"),
        "memory": Path("/sys/fs/cgroup/memory"),
        "pids": Path("/sys/fs/cgroup/pids"),
    }  # cpuset is not cpu
    v2, own = cgroups._own(HYBRID_OWN)
    assert v2 == "/system.slice/agent.service"
    assert own == {"pids": "/system.slice/agent.service", "memory": "/box/1", "cpu": "/"}


def _tree(root: Path) -> str:
    """Three v1 hierarchies under `root`, the agent's own cgroups in them, as mounts text."""
    for controller, own in (("memory", "box/1"), ("cpu", ""), ("pids", "")):
        (root / controller / own).mkdir(parents=True, exist_ok=True)
    return "".join(
        f"cgroup {root / c} cgroup rw,relatime,{c} 0 0\n" for c in ("memory", "cpu", "pids")
    )


def test_v1_parents_are_under_the_agents_own_cgroup(tmp_path: Path) -> None:
    mounts = _tree(tmp_path)
    found = cgroups.detect("auto", mounts=mounts, own="4:memory:/box/1\n1:cpu:/\n8:pids:/\n")
    assert found.mode == "v1" and found.v2 is None
    assert found.v1 == {
        "memory": tmp_path / "memory/box/1/heteroflow",
        "cpu": tmp_path / "cpu/heteroflow",
        "pids": tmp_path / "pids/heteroflow",
    }
    # and no probe is left behind
    assert list((tmp_path / "memory/box/1/heteroflow").iterdir()) == []


def test_v1_falls_back_to_the_top_and_a_configured_parent_wins(tmp_path: Path) -> None:
    mounts = _tree(tmp_path)
    (tmp_path / "memory/box/1/heteroflow").write_text("")  # in the way: cannot be made
    found = cgroups.detect("v1", mounts=mounts, own="4:memory:/box/1\n")
    assert found.v1["memory"] == tmp_path / "memory/heteroflow"
    configured = cgroups.detect("auto", "/ops/hf", mounts=mounts, own="4:memory:/box/1\n")
    assert configured.v1["memory"] == tmp_path / "memory/ops/hf"


def test_asking_for_v2_where_only_v1_has_the_memory_controller_is_none(tmp_path: Path) -> None:
    mounts = _tree(tmp_path) + f"cgroup2 {tmp_path / 'unified'} cgroup2 rw 0 0\n"
    (tmp_path / "unified").mkdir()
    (tmp_path / "unified/cgroup.controllers").write_text("\n")  # as on a hybrid host
    assert cgroups.detect("v2", mounts=mounts, own="0::/\n").mode == "none"
    assert cgroups.detect("auto", mounts=mounts, own="0::/\n").mode == "v1"
    assert cgroups.detect("none", mounts=mounts, own="0::/\n").mode == "none"


def test_a_failed_limit_leaves_no_cgroup_behind(tmp_path: Path) -> None:
    parent = tmp_path / "memory/heteroflow"
    parent.mkdir(parents=True)
    # The memory cgroup is made, then the cpu one cannot be (its parent does not exist).
    broken = cgroups.Cgroups(mode="v1", v1={"memory": parent, "cpu": tmp_path / "nowhere"})
    with pytest.raises(OSError):
        broken.make("u-0", memory_mb=64, cpu_cores=1, pids=0)
    assert list(parent.iterdir()) == []  # the memory cgroup made first is removed again
    ok = cgroups.Cgroups(mode="v1", v1={"memory": parent})
    made = ok.make("v-0", memory_mb=64, cpu_cores=1, pids=0)
    assert made == {"mode": "v1", "dirs": [str(parent / "v-0")], "memory": str(parent / "v-0")}
    assert (parent / "v-0/memory.limit_in_bytes").read_text() == str(64 << 20)


class FakeKernel:
    """Writes to `cgroup.subtree_control` as the kernel takes them (`+name` adds a controller
    the cgroup has; `busy` cgroups refuse, as one with processes of its own does), and the
    refused controllers (cpu with realtime threads outside the root)."""

    def __init__(self, busy: set[Path], refused: set[str]) -> None:
        self.busy, self.refused = busy, refused

    def write(self, path: Path, value: str) -> None:
        if path.name != "cgroup.subtree_control":
            path.write_text(value)
            return
        name = value.removeprefix("+")
        if path.parent in self.busy or name in self.refused:
            raise OSError(16, "Device or resource busy")
        enabled = path.read_text().split()
        path.write_text(" ".join([*enabled, name]))


def _v2_tree(root: Path, own: str, controllers: str = "cpu memory pids") -> None:
    for d in (root, root / own, root / own / "heteroflow", root / "heteroflow"):
        d.mkdir(parents=True, exist_ok=True)
        # a child's controllers are what its parent enables; stand them in up front
        (d / "cgroup.controllers").write_text(controllers)
        (d / "cgroup.subtree_control").write_text("")


def test_v2_a_delegated_own_cgroup_then_the_top(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _v2_tree(tmp_path, "svc")
    mounts = f"cgroup2 {tmp_path} cgroup2 rw 0 0\n"
    kernel = FakeKernel(busy=set(), refused={"cpu"})
    monkeypatch.setattr(cgroups, "_write", kernel.write)
    found = cgroups.detect("auto", mounts=mounts, own="0::/svc\n")
    assert (found.mode, found.v2) == ("v2", tmp_path / "svc/heteroflow")
    # cpu refused, memory and pids enabled for the tasks
    assert (tmp_path / "svc/heteroflow/cgroup.subtree_control").read_text().split() == [
        "memory",
        "pids",
    ]
    # The agent's own cgroup holds its processes and had nothing enabled: the top instead.
    _v2_tree(tmp_path / "b", "svc")
    kernel.busy = {tmp_path / "b/svc"}
    found = cgroups.detect("v2", mounts=f"cgroup2 {tmp_path / 'b'} cgroup2 rw 0 0\n", own="0::/svc")
    assert found.v2 == tmp_path / "b/heteroflow"
    made = found.make("t-0", memory_mb=64, cpu_cores=1.5, pids=0)
    assert made is not None and made["memory"] == str(tmp_path / "b/heteroflow/t-0")
    assert (tmp_path / "b/heteroflow/t-0/memory.max").read_text() == str(64 << 20)
    # Nothing can be enabled anywhere: none.
    _v2_tree(tmp_path / "c", "svc")
    kernel.busy = {tmp_path / "c", tmp_path / "c/svc"}
    assert (
        cgroups.detect(
            "auto", mounts=f"cgroup2 {tmp_path / 'c'} cgroup2 rw 0 0\n", own="0::/svc"
        ).mode
        == "none"
    )
