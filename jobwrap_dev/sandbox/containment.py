"""The process containment the sandbox's Slurm runs: what GPU sites run, on this host's cgroups.

Sites run ``proctrack/cgroup``, ``task/cgroup,task/affinity`` with ``ConstrainDevices``,
``ConstrainRAMSpace`` and ``ConstrainCores``, ``PrologFlags=Alloc,Contain`` and
``jobacct_gather/cgroup``; the sandbox does the same by default
(``JOBWRAP_SANDBOX_CONTAINMENT=none``: Slurm's ``linuxproc``/``task/none``, for a host
without writable cgroups). Which cgroup version is decided from the host, never silently:
``describe`` is the one line the sandbox prints at start (docs/containment.md).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

from wrapper.errors import JobwrapError
from wrapper.fastdataclass import dataclass

VARIABLE = "JOBWRAP_SANDBOX_CONTAINMENT"
MODES = ("cgroup", "none")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# the v1 controllers Slurm's cgroup/v1 plugin uses for what the sandbox constrains
V1_CONTROLLERS = ("freezer", "cpuset", "memory", "devices", "cpuacct")


class ContainmentError(JobwrapError):
    """The containment asked for cannot run on this host."""


def mode_from_env(env: Mapping[str, str] | None = None) -> str:
    mode = (os.environ if env is None else env).get(VARIABLE, "").strip() or "cgroup"
    if mode not in MODES:
        raise ContainmentError(f"{VARIABLE}={mode!r}: use one of {', '.join(MODES)}")
    return mode


@dataclass(frozen=True)
class Host:
    """The cgroup facts of this host that decide the plugin."""

    v2_controllers: tuple[str, ...]  # those a cgroup2 mount can delegate
    v2_root: str  # where that cgroup2 is mounted ("" none)
    v1_writable: tuple[str, ...]  # v1 controllers mounted and writable here
    v1_missing: tuple[str, ...]


def _mounts(text: str) -> list[tuple[str, str, str]]:
    out = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4:
            out.append((fields[1], fields[2], fields[3]))  # mount point, type, options
    return out


def probe(mounts_text: str | None = None, root: Path = CGROUP_ROOT) -> Host:
    if mounts_text is None:
        try:
            mounts_text = Path("/proc/self/mounts").read_text()
        except OSError:
            mounts_text = ""
    mounts = _mounts(mounts_text)
    v2_root = next((point for point, kind, _ in mounts if kind == "cgroup2"), "")
    v2_controllers: tuple[str, ...] = ()
    if v2_root:
        with contextlib.suppress(OSError):
            v2_controllers = tuple((Path(v2_root) / "cgroup.controllers").read_text().split())
    v1 = {opt for point, kind, options in mounts if kind == "cgroup"
          for opt in options.split(",")}
    writable = tuple(c for c in V1_CONTROLLERS
                     if c in v1 and os.access(root / c, os.W_OK))
    missing = tuple(c for c in V1_CONTROLLERS if c not in writable)
    return Host(v2_controllers, v2_root, writable, missing)


@dataclass(frozen=True)
class Plan:
    mode: str
    version: str  # "v1", "v2", "" (none)
    slurm_lines: str  # slurm.conf lines
    cgroup_conf: str  # cgroup.conf ("" none)
    line: str  # what the sandbox says at start


NONE_LINES = ("ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
              "JobAcctGatherType=jobacct_gather/none\nPrologFlags=Alloc\n")
CGROUP_LINES = ("ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup,task/affinity\n"
                "JobAcctGatherType=jobacct_gather/cgroup\nPrologFlags=Alloc,Contain\n")
CONSTRAINTS = "ConstrainCores=yes\nConstrainDevices=yes\nConstrainRAMSpace=yes\n"


def plan(mode: str, host: Host | None = None) -> Plan:
    """What this host runs for ``mode``; ContainmentError when it cannot run it at all."""
    if mode == "none":
        return Plan(mode, "", NONE_LINES, "",
                    f"containment: none ({VARIABLE}=none): proctrack/linuxproc, task/none, "
                    "no cgroup constraints")
    host = host or probe()
    # v2 wants every controller it constrains in the cgroup2 root; a hybrid host binds
    # them to v1, which leaves its cgroup2 mount empty.
    need_v2 = {"cpuset", "memory"}
    if host.v2_root == str(CGROUP_ROOT) and need_v2 <= set(host.v2_controllers):
        version = "v2"
        why = f"cgroup v2 at {host.v2_root}"
    elif not host.v1_missing:
        version = "v1"
        why = "cgroup v1"
        if host.v2_root:
            held = ",".join(host.v2_controllers) or "none"
            why += (f"; not v2: the cgroup2 at {host.v2_root} holds controllers: {held} "
                    "(this host binds cpuset, memory and devices to v1)")
    else:
        raise ContainmentError(
            "the sandbox runs Slurm's cgroup containment, and this host offers neither a "
            f"cgroup v2 root with cpuset and memory nor writable v1 controllers "
            f"({', '.join(host.v1_missing)} missing or read-only under {CGROUP_ROOT}); "
            f"set {VARIABLE}=none to run without containment")
    conf = f"CgroupPlugin=cgroup/{version}\nCgroupMountpoint={CGROUP_ROOT}\n{CONSTRAINTS}"
    return Plan(mode, version, CGROUP_LINES, conf,
                f"containment: {why}: proctrack/cgroup, task/cgroup+affinity, "
                "ConstrainCores/Devices/RAMSpace, PrologFlags=Alloc,Contain, "
                "jobacct_gather/cgroup")
