"""Each sandbox cluster takes job ids no other sandbox on the host took before it: cgroup
v1 paths are host-wide, and the kernel log keeps an OOM-kill record of a job id across
sandboxes (root's OOM evidence reads it), as a site's job ids never repeat."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwrap_dev.sandbox import cluster as cluster_mod
from jobwrap_dev.sandbox.cluster import Cluster, Spec


def test_each_sandbox_takes_the_next_block_of_job_ids(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_mod, "JOB_ID_COUNTER", tmp_path / "counter")
    same_ports = Spec(base=str(tmp_path / "a"))  # the same ports, run after run
    firsts = [Cluster(same_ports)._first_job_id() for _ in range(3)]
    assert firsts == [cluster_mod.JOB_ID_BLOCK * n for n in (1, 2, 3)], firsts


def test_the_blocks_wrap_below_slurms_default_max_job_id(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    counter = tmp_path / "counter"
    monkeypatch.setattr(cluster_mod, "JOB_ID_COUNTER", counter)
    counter.write_text(f"{cluster_mod.JOB_ID_BLOCKS - 1}\n")  # the last block was taken
    first = Cluster(Spec(base=str(tmp_path / "a")))._first_job_id()
    assert first == cluster_mod.JOB_ID_BLOCK  # back to the first, never 0
    last = (cluster_mod.JOB_ID_BLOCKS - 1) * cluster_mod.JOB_ID_BLOCK
    assert last + cluster_mod.JOB_ID_BLOCK <= 67_043_328  # Slurm's default MaxJobId
    counter.write_text("garbage\n")
    assert Cluster(Spec(base=str(tmp_path / "a")))._first_job_id() == cluster_mod.JOB_ID_BLOCK
