"""The Slurm adapter against the real cluster: drain/resume, requeue, exclusions, reads."""

from __future__ import annotations

import time

import pytest

from jobwrap_dev.sandbox.cluster import Cluster
from wrapper import slurm
from wrapper.config import SlurmConfig
from wrapper.errors import SlurmError
from wrapper.runner import Runner
from wrapper.slurm import SlurmBackend
from wrapper.slurm.parse import expand_hostlist


@pytest.fixture
def adapter(cluster: Cluster) -> SlurmBackend:
    return slurm.backend(SlurmConfig(backend="cli", command_timeout=20), Runner(cluster.env()))


def sinfo_reason(cluster: Cluster, node: str) -> str:
    res = Runner(cluster.env()).run(["sinfo", "-h", "-N", "-n", node, "-o", "%E|%T"],
                                    timeout=10)
    return res.stdout.strip()


def test_version(adapter: SlurmBackend) -> None:
    version = adapter.version()
    assert version.count(".") == 2 and version.split(".")[0].isdigit(), version


def test_drain_with_reason_then_resume(cluster: Cluster, adapter: SlurmBackend) -> None:
    reason = adapter.drain_node("n2", "ecc on gpu 1: 3 uncorrectable (volatile)")
    assert reason == "jobwrap: ecc on gpu 1: 3 uncorrectable (volatile)"
    try:
        assert sinfo_reason(cluster, "n2") == f"{reason}|drained"
        info = adapter.node_info("n2")
        assert "DRAIN" in info["State"]
        assert info["Reason"].startswith(reason)
    finally:
        adapter.resume_node("n2")
    cluster.wait_idle(timeout=30)
    assert "DRAIN" not in adapter.node_info("n2")["State"]


def test_drain_of_unknown_node_names_the_command(adapter: SlurmBackend) -> None:
    with pytest.raises(SlurmError, match="scontrol update NodeName=n9"):
        adapter.drain_node("n9", "x")


# --max-restarts=0: jobwrap itself does not requeue it; --requeue (at submit): Slurm may.
REQUEUE_JOB = """#!/bin/bash
#SBATCH --output=requeue-%j.out
#SBATCH --open-mode=append
#JOBWRAP --max-restarts=0
echo "attempt=$JOBWRAP_ATTEMPT restart=${SLURM_RESTART_COUNT:-0}"
[ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] || exit 3
"""


def test_requeue_a_failed_job_runs_again_at_once(cluster: Cluster,
                                                 adapter: SlurmBackend) -> None:
    job_id = cluster.submit(REQUEUE_JOB, "--requeue", name="requeue.sh")
    info = cluster.wait_job(job_id)
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "3:0")
    assert "#SBATCH --output=requeue-%j.out" in adapter.batch_script(job_id)

    started = time.monotonic()
    adapter.requeue(job_id, eligible_now=True)
    info = cluster.wait_job(job_id, states={"COMPLETED"}, timeout=60)
    # Slurm's own requeue delay is 121 s: running well before it proves eligible_now worked.
    assert time.monotonic() - started < 60
    assert info["Restarts"] == "1"
    lines = [line for line in (cluster.work / f"requeue-{job_id}.out").read_text().splitlines()
             if not line.startswith("jobwrap: ")]
    assert lines == ["attempt=0 restart=0", "attempt=1 restart=1"]


def test_exclude_nodes_of_a_pending_job(cluster: Cluster, adapter: SlurmBackend) -> None:
    job_id = cluster.submit("#!/bin/bash\ntrue\n", "--hold", name="held.sh")
    try:
        assert adapter.exclude_nodes(job_id, ["n1"]) == ["n1"]
        assert adapter.job_info(job_id)["ExcNodeList"] == "n1"
        assert adapter.exclude_nodes(job_id, ["n2", "n1"]) == ["n1", "n2"]
        assert expand_hostlist(adapter.job_info(job_id)["ExcNodeList"]) == ["n1", "n2"]
    finally:
        Runner(cluster.env()).run(["scancel", job_id], timeout=10)


def test_job_and_node_info(cluster: Cluster, adapter: SlurmBackend) -> None:
    info = adapter.node_info("n1")
    assert info["NodeName"] == "n1"
    assert "gpu:4" in info["Gres"]
    with pytest.raises(SlurmError):
        adapter.job_info("999999")
