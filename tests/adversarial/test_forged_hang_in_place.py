"""A job claims its hang was restarted in place (``hang.in_place`` in its own event file)
so that root's epilog does not class the attempt a hang (docs/security.md row 27): the
epilog reads the supervisor's root-owned channel only, where the supervisor, which found
no ``jobwrap run`` of the attempt, ended the whole job and wrote no such fact."""

from __future__ import annotations

from jobwrap_dev.sandbox.cluster import Cluster

CLAIM = """#!/bin/bash
#SBATCH --output={work}/hangclaim-%j.out --open-mode=append
#JOBWRAP --max-restarts=1 --hang-timeout=8s
events={state}/jobs/$SLURM_JOB_ID/user-events.jsonl
if [ "${{SLURM_RESTART_COUNT:-0}}" = 0 ]; then
  while :; do  # before the hang, after it, until the job ends: always the newest line
    printf '{{"ts":%s,"event":"hang.in_place","attempt":0,"node":"%s","steps":["%s.0"]}}\\n' \\
      "$(date +%s.%N)" "$SLURMD_NODENAME" "$SLURM_JOB_ID" >> "$events"
    sleep 1
  done &
  srun sleep 300  # no output, no checkpoint: a hang
  sleep 5  # a job ended whole loses its batch shell within ms of its step (not at once)
  echo "the batch script outlived its hang"
  exit 0
fi
echo resumed
"""


def test_a_forged_in_place_restart_does_not_hide_a_hang_from_the_epilog(
        cluster: Cluster) -> None:
    job_id = cluster.submit(CLAIM.format(work=cluster.work, state=cluster.state_in_script),
                            name="hangclaim.sh")
    info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
    output = (cluster.work / f"hangclaim-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, output)
    assert "outlived" not in output and "resumed" in output, output  # ended whole
    events = cluster.events(job_id)
    ends = [(e["attempt"], e["kind"], e["decision"]) for e in events
            if e["event"] == "attempt.end" and e["source"] == "root"]
    assert ends == [(0, "hang", "requeue"), (1, "success", "done")], (ends, output)
    claims = [e for e in events if e["event"] == "hang.in_place"]
    assert claims and all(e["source"] == "user" for e in claims), claims
