"""A job prints the OOM killer's words to get its failure classed host_oom.

The job fails on its own and prints what the kernel logs for an OOM kill (``Out of
memory: Killed process ...``, an ``oom-kill:`` line naming its own cgroup). Root classes
``host_oom`` from Slurm's and the cgroup's record of a kill only, never from the output:
the attempt stays ``user_error``, the words named as unconfirmed (docs/containment.md).
The real kill, classed ``host_oom``, is tests/e2e/test_containment.py's.
"""

from __future__ import annotations

import time

from jobwrap_dev.sandbox.cluster import Cluster

SAID = """#!/bin/bash
#SBATCH --nodes=1 --mem=150M --output=oom-%j.out --no-requeue
echo "Out of memory: Killed process 4242 (python3) total-vm:9000000kB"
echo "oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/slurm_n1/uid_0/job_$SLURM_JOB_ID"
exit 1
"""


def root_ends(cluster: Cluster, job_id: str) -> list[tuple[int, str, str]]:
    return [(e["attempt"], e["kind"], e["detail"])
            for e in cluster.events(job_id)
            if e["event"] == "attempt.end" and e["source"] == "root"]


def test_an_oom_message_without_an_oom_kill_is_not_host_oom(cluster: Cluster) -> None:
    said = cluster.submit(SAID, name="oom-said.sh")
    cluster.wait_job(said, timeout=90)
    deadline = time.monotonic() + 30
    while not root_ends(cluster, said):
        assert time.monotonic() < deadline, "no epilog decision"
        time.sleep(0.3)
    [(_, kind, detail)] = root_ends(cluster, said)
    assert kind == "user_error", (kind, detail)
    assert "no OOM kill recorded" in detail, detail
