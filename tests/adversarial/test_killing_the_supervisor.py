"""The job's user kills the attempt's supervisor (it runs with their rights), again and
again: root's watcher on the first node starts it again, at most three times in the
attempt, and the job goes on to its end; nothing drains, nothing of root's is signalled.
"""

from __future__ import annotations

import contextlib
import pwd
import subprocess
import time

import psutil

from jobwrap_dev.sandbox.cluster import Cluster
from wrapper.slurm.parse import expand_hostlist

JOB = """#!/bin/bash
#SBATCH --output={work}/unsupervised-%j.out
for i in $(seq 1 120); do echo "step $i"; [ -e {work}/stop-$SLURM_JOB_ID ] && break; sleep 1; done
"""


def supervisor_pids(cluster: Cluster, job_id: str, *, dropped: bool = False) -> list[int]:
    """The job's supervisors; ``dropped``: only those already running as the job's user
    (a starting one is root's until it drops its rights: the user cannot signal it)."""
    uid = pwd.getpwnam(cluster.spec.user).pw_uid
    found = []
    for proc in cluster.runtime_processes():
        with contextlib.suppress(psutil.Error):
            if "supervise" in proc.cmdline() and job_id in proc.cmdline() and (
                    not dropped or set(proc.uids()) == {uid}):
                found.append(proc.pid)
    return found


def test_the_user_kills_the_supervisor_root_starts_it_again(cluster: Cluster) -> None:
    job_id = cluster.submit(JOB.format(work=cluster.work), name="unsupervised.sh")
    killed: list[int] = []
    try:
        cluster.wait_job(job_id, states={"RUNNING"}, timeout=60)
        deadline = time.monotonic() + 100
        while len(killed) < 4 and time.monotonic() < deadline:
            pids = [p for p in supervisor_pids(cluster, job_id, dropped=True)
                    if p not in killed]
            if pids:
                # as the job's user: the supervisor runs with their rights
                done = subprocess.run(["runuser", "-u", cluster.spec.user, "--", "kill", "-9",
                                       str(pids[0])], check=False, capture_output=True)
                assert done.returncode == 0, done.stderr
                killed.append(pids[0])
            time.sleep(0.5)
        first = expand_hostlist(cluster.job(job_id)["NodeList"])[0]
        restarts = [(e["restarts"], e["node"]) for e in cluster.events(job_id)
                    if e["event"] == "supervisor.restarted" and e["source"] == "root"]
        assert restarts == [(1, first), (2, first), (3, first)], restarts
        assert len(killed) == 4, killed  # the first and the three restarted ones
        time.sleep(5)  # the limit is reached: no fourth restart
        assert supervisor_pids(cluster, job_id) == []
        cluster.write_user_file(f"stop-{job_id}", "")  # the kills are done: the job ends
        info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED", "CANCELLED"},
                                timeout=120)
        assert info["JobState"] == "COMPLETED", info
        assert "DRAIN" not in "".join(cluster.node_states().values()).upper()
    finally:
        subprocess.run(["scancel", job_id], env=cluster.env(), check=False,
                       capture_output=True)
