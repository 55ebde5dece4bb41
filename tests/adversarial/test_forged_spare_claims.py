"""A job claims it can move onto a spare so that a node watcher's GPU fault ends only its
steps, not its batch script (docs/security.md row 26): root's watcher decides from root's
record of the job's options, so a job that holds no spare is ended whole."""

from __future__ import annotations

import time

from jobwrap_dev.sandbox.cluster import Cluster
from wrapper.runner import Runner

CLAIM = """#!/bin/bash
#SBATCH --output={work}/spareclaim-%j.out -N2 --gres=gpu:1
#JOBWRAP --no-requeue
events={state}/jobs/$SLURM_JOB_ID/user-events.jsonl
for kind in run.started run.spare_used; do
  printf '{{"ts":%s,"event":"%s","attempt":0,"node":"n1","command":"srun","working":1}}\\n' \\
    "$(date +%s.%N)" "$kind" >> "$events"
done
echo started
srun sleep 120
echo "the batch script outlived its node's fault"
sleep 120
"""


def test_a_job_without_spares_cannot_claim_one_to_keep_running(cluster: Cluster) -> None:
    job_id = cluster.submit(CLAIM.format(work=cluster.work, state=cluster.state_in_script),
                            name="spareclaim.sh")
    out = cluster.work / f"spareclaim-{job_id}.out"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "started" not in (out.read_text() if out.exists()
                                                          else ""):
        time.sleep(0.2)
    first = next(e for e in cluster.events(job_id) if e["event"] == "prolog.context")
    nodes = first["context"]["nodes"]
    other = nodes[1]
    gpus = next(e for e in cluster.events(job_id) if e["event"] == "prolog.context"
                and e["node"] == other)["context"]["gpus"]
    try:
        time.sleep(2)  # the step runs on both nodes
        cluster.set_gpu_faults(other, {g: {"xid_events": (79,)} for g in gpus})
        info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED", "CANCELLED"},
                                timeout=90)
        output = out.read_text()
        assert info["JobState"] in ("FAILED", "CANCELLED"), (info, output)
        assert "outlived" not in output, output  # the whole job ended, batch script too
        ended = [e for e in cluster.events(job_id) if e["event"] == "watch.ended_job"
                 and e["source"] == "root"]
        assert ended and ended[0]["node"] == other, cluster.events(job_id)
    finally:
        cluster.set_gpu_faults(other)
        Runner(cluster.env()).run(["scontrol", "update", f"NodeName={other}",
                                   "State=RESUME"], timeout=20, check=False)
        cluster.wait_idle(timeout=60)
