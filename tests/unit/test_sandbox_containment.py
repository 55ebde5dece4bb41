"""The sandbox's choice of process containment, from a host's cgroup facts."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwrap_dev.sandbox import containment
from jobwrap_dev.sandbox.containment import ContainmentError, Host, plan, probe

HYBRID = """tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/devices cgroup rw,relatime,devices 0 0
cgroup /sys/fs/cgroup/freezer cgroup rw,relatime,freezer 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""


def test_a_hybrid_host_runs_v1_and_says_why_not_v2(tmp_path: Path) -> None:
    for name in containment.V1_CONTROLLERS:
        (tmp_path / name).mkdir()
    host = probe(HYBRID, root=tmp_path)
    assert host.v1_missing == () and host.v2_root == "/sys/fs/cgroup/unified"
    chosen = plan("cgroup", host)
    assert chosen.version == "v1"
    assert "CgroupPlugin=cgroup/v1" in chosen.cgroup_conf
    assert "ConstrainDevices=yes" in chosen.cgroup_conf
    assert "ProctrackType=proctrack/cgroup" in chosen.slurm_lines
    assert "PrologFlags=Alloc,Contain" in chosen.slurm_lines
    assert "not v2" in chosen.line and "/sys/fs/cgroup/unified" in chosen.line


def test_a_v2_host_with_its_controllers_runs_v2() -> None:
    host = Host(("cpuset", "cpu", "io", "memory", "pids"), "/sys/fs/cgroup", (),
                containment.V1_CONTROLLERS)
    chosen = plan("cgroup", host)
    assert chosen.version == "v2" and "CgroupPlugin=cgroup/v2" in chosen.cgroup_conf


def test_a_host_without_cgroups_is_told_how_to_go_on() -> None:
    host = Host((), "", ("memory",), ("freezer", "cpuset", "devices", "cpuacct"))
    with pytest.raises(ContainmentError, match="JOBWRAP_SANDBOX_CONTAINMENT=none") as err:
        plan("cgroup", host)
    assert "freezer" in str(err.value)


def test_none_is_linuxproc_and_unknown_modes_are_refused() -> None:
    chosen = plan("none")
    assert chosen.cgroup_conf == "" and "proctrack/linuxproc" in chosen.slurm_lines
    assert containment.mode_from_env({}) == "cgroup"
    with pytest.raises(ContainmentError, match="cgroup, none"):
        containment.mode_from_env({containment.VARIABLE: "v3"})
