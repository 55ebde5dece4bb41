"""A slow node made on purpose: one process held to a share of a CPU by a cgroup quota.

What a throttled or shared node does to its ranks (a noisy neighbour, a power cap), made
the way the kernel does it, for the slow-node test and benchmark: the process is moved
into a cgroup of its own under the ``cpu`` controller with ``cfs_quota`` / ``cfs_period``
= ``cpus``. On cgroup v1 that is ``/sys/fs/cgroup/cpu/NAME`` (the ``cpu`` hierarchy
only: Slurm's cpuset, memory and freezer cgroups of the job keep the process); on cgroup
v2, ``/sys/fs/cgroup/NAME`` with ``cpu.max`` (the process leaves the job's cgroup there,
which only a test may do). Root only; the cgroup is removed when the block ends.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


@contextlib.contextmanager
def throttled(pid: int, cpus: float, name: str) -> Iterator[Path]:
    """Hold process ``pid`` (all its threads) to ``cpus`` of a CPU inside the block."""
    quota = max(1000, int(cpus * PERIOD_US))
    if (ROOT / "cpu" / "cpu.cfs_quota_us").exists():  # v1
        group = ROOT / "cpu" / name
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
        back = ROOT / "cpu" / "cgroup.procs"
    elif (ROOT / "cgroup.controllers").exists():  # v2
        if "cpu" not in (ROOT / "cgroup.subtree_control").read_text().split():
            (ROOT / "cgroup.subtree_control").write_text("+cpu")
        group = ROOT / name
        group.mkdir()
        (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        back = ROOT / "cgroup.procs"
    else:
        raise RuntimeError(f"no cpu controller under {ROOT} to throttle pid {pid} with")
    try:
        (group / "cgroup.procs").write_text(str(pid))
        yield group
    finally:
        # back to the root cgroup while alive; an ended process left it by itself
        with contextlib.suppress(OSError):
            for left in (group / "cgroup.procs").read_text().split():
                back.write_text(left)
        with contextlib.suppress(OSError):
            os.rmdir(group)
