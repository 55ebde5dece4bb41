"""The sandbox's own leftovers: a slurmstepd its slurmd left behind is stopped with it."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from jobwrap_dev.sandbox.cluster import Cluster, Spec


def test_a_slurmstepd_of_this_cluster_is_found_and_no_other(tmp_path: Path) -> None:
    """A test that kills a slurmd under a job leaves the job's extern slurmstepd waiting
    for it; ``down`` stops it by pid, found by the cluster's own SLURM_CONF."""
    ours, theirs = (Cluster(Spec(base=str(tmp_path / name))) for name in ("a", "b"))
    ours.base.mkdir()
    program = tmp_path / "slurmstepd"  # a process by that name, as slurmstepd's comm is
    shutil.copy("/bin/sleep", program)
    procs = [subprocess.Popen([str(program), "60"],
                              env={**os.environ, "SLURM_CONF": str(c.conf)})
             for c in (ours, theirs)]
    try:
        deadline = time.monotonic() + 10
        while not ours.stepds() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [p.pid for p in ours.stepds()] == [procs[0].pid]
        ours.down()
        procs[0].wait(timeout=10)  # ended (down reaped it: no status is left to read)
        assert ours.stepds() == [] and procs[1].poll() is None
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
