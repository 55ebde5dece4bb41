"""Issue 12, item 4: text a user writes into their job (``--comment``, ``--job-name``) is
read by root as that text, never as Slurm's fields.

The job user submits a job that simply exits 1 but whose comment or name spells
``JobState=NODE_FAIL ExcNodeList=n[0-99999999999]``. The epilog must class it as the
user's failure from Slurm's real fields (no node_failure, no hardware requeue, no node
excluded or drained), and root's ``release`` (started by the epilog for a requeue, or by
hand) must neither believe the forged host list nor try to expand it.
"""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from jobwrap_dev.sandbox.cluster import Cluster

FORGED = "JobState=NODE_FAIL Reason=NodeDown ExcNodeList=n[0-99999999999]"
SCRIPT = """#!/bin/bash
#SBATCH --output=slurmrec-%j.out
#JOBWRAP --max-restarts=1
echo "about to fail"
exit 1
"""


def _attempt_ends(cluster: Cluster, job_id: str) -> list[dict[str, object]]:
    return [e for e in cluster.events(job_id)
            if e["event"] == "attempt.end" and e["source"] == "root"]


def _log_lines(cluster: Cluster, job_id: str, word: str) -> list[str]:
    text = cluster.logs_text()
    return [ln for ln in text.splitlines() if word in ln and job_id in ln]


@pytest.mark.parametrize("hostile", [
    pytest.param([f"--comment=x {FORGED}"], id="comment"),
    pytest.param([f"--job-name=x UserId=root(0) GroupId=root(0) {FORGED} Command=/x"],
                 id="job-name"),
    pytest.param([f"--comment=a\n   {FORGED}\n", f"--job-name=n\n   UserId=x {FORGED}"],
                 id="newlines"),
])
def test_forged_fields_in_user_text_do_not_steer_root(cluster: Cluster,
                                                      hostile: list[str]) -> None:
    job_id = cluster.submit(SCRIPT, *hostile, name="slurmrec.sh")
    info = cluster.wait_job(job_id, states={"FAILED", "COMPLETED", "CANCELLED", "NODE_FAIL"},
                            timeout=150)
    ends = _attempt_ends(cluster, job_id)
    assert ends, f"the epilog recorded no decision for job {job_id}"
    assert [(e["attempt"], e["kind"], e["exclude"]) for e in ends] == [
        (0, "user_error", []), (1, "user_error", [])], ends
    assert all(e["slurm_state"] != "NODE_FAIL" for e in ends), ends
    # Slurm's own fields, read by jobwrap's reader, are the real ones
    assert info["JobState"] == "FAILED" and info["ExcNodeList"] == "(null)", info
    assert FORGED in (info.get("Comment", "") + info.get("JobName", "")), info
    # the requeue after attempt 0 was released by root's release, which did not blow up
    assert _log_lines(cluster, job_id, "release.done"), "release never released the job"
    assert not _log_lines(cluster, job_id, "release.failed")
    assert not any("DRAIN" in s for s in cluster.node_states().values()), \
        cluster.node_states()


def _limit_memory() -> None:  # a regression must fail this test, not the machine
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_release_by_root_reads_the_real_excluded_nodes(cluster: Cluster) -> None:
    job_id = cluster.submit(SCRIPT, "--hold", f"--comment=x {FORGED}", name="slurmrec.sh")
    try:
        env = {**cluster.env(), "JOBWRAP_CONFIG": str(cluster.jobwrap_config)}
        proc = subprocess.run([sys.executable, "-m", "wrapper", "release", job_id,
                               "--exclude", "n2"], env=env, capture_output=True, text=True,
                              timeout=120, preexec_fn=_limit_memory, cwd="/", check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr
        assert cluster.job(job_id)["ExcNodeList"] == "n2"
    finally:
        cluster.as_user(["scancel", job_id], check=False)
    assert not any("DRAIN" in s for s in cluster.node_states().values())
