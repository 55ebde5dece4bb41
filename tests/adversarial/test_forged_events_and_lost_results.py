"""Root decides from root's facts, and never loses results: attacks by the job's user.

Items 8 (forged events steer root) and 6 (results lost) of issue 12, played on the real
sandbox Slurm by the test user's own jobs.
"""

from __future__ import annotations

import os
import pwd
import stat

import pytest

from jobwrap_dev.sandbox.cluster import Cluster
from wrapper.slurm.parse import expand_hostlist

FORGE = """#!/bin/bash
#SBATCH --output={work}/forge-{what}-%j.out
#JOBWRAP --max-restarts=1
events={state}/jobs/$SLURM_JOB_ID/user-events.jsonl
forge() {{
  printf '{{"ts":%s,"event":"%s","attempt":%s,"node":"%s","hook":"supervisor",%s}}\\n' \\
    "$(date +%s.%N)" "$1" "$JOBWRAP_ATTEMPT" "$SLURMD_NODENAME" "$2" >> "$events"
}}
{lines}
echo kept > "$JOBWRAP_SCRATCH/file"
exit 1
"""
# what root once took from the user's own event file and the job's own output
FORGED = {
    "prolog.unhealthy": "forge prolog.unhealthy '\"reason\":\"forged\"'",
    "gpu.fault": "forge gpu.fault '\"reason\":\"xid gpu0: forged\"'\n"
                 "forge hang '\"idle_s\":999'\n"
                 "echo 'NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.'",
    # a skipped prolog ("unchecked": retried, not counted, off the node) claimed by the job
    "attempt.unchecked": "forge attempt.unchecked '\"reason\":\"forged\",\"excluded\":true'\n"
                         "echo \"jobwrap: job $SLURM_JOB_ID did not start on "
                         "$SLURMD_NODENAME: jobwrap's prolog did not run on "
                         "$SLURMD_NODENAME for attempt $JOBWRAP_ATTEMPT\"",
    # issue 22, item 2: one line no JSON reader can take (RecursionError in json.loads)
    # once crashed the epilog before its decision, the requeued prolog's resume lookup
    # and the watcher; a 300 KiB line and a NaN beside it
    "poison": "head -c 307200 /dev/zero | tr '\\0' 'a' >> \"$events\"; echo >> \"$events\"\n"
              "printf '%*s\\n' 100000 '' | tr ' ' '[' >> \"$events\"\n"
              "forge checkpoint '\"path\":\"x\",\"ts2\":NaN'",
}


def root_events(cluster: Cluster, job_id: str) -> list[dict[str, object]]:
    return [e for e in cluster.events(job_id) if e["source"] == "root"]


@pytest.mark.parametrize("what", sorted(FORGED))
def test_forged_events_do_not_steer_the_epilog(cluster: Cluster, what: str) -> None:
    script = FORGE.format(work=cluster.work, state=cluster.state_in_script, what=what,
                          lines=FORGED[what])
    job_id = cluster.submit(script, name=f"forge-{what}.sh")
    info = cluster.wait_job(job_id, timeout=150)
    output = (cluster.work / f"forge-{what}-{job_id}.out").read_text()
    assert info["JobState"] == "FAILED", output
    events = root_events(cluster, job_id)
    nodes = {str(e["node"]) for e in events if e["event"] == "prolog.context"}
    # the epilog ran to its end for every attempt: decision, archive, cleanup
    ends = [e for e in events if e["event"] == "attempt.end"]
    assert [(e["attempt"], e["kind"]) for e in ends] == [(0, "user_error"), (1, "user_error")], \
        (ends, output)
    assert all(e["exclude"] == [] for e in ends), ends  # no hardware requeue, no exclusion
    archived = {e["attempt"] for e in events if e["event"] == "archive"}
    cleaned = {e["attempt"] for e in events if e["event"] == "scratch.removed"}
    assert archived == cleaned == {0, 1}, events
    assert not any(p.exists() for p in cluster.scratch_paths(job_id))
    assert cluster.job(job_id).get("ExcNodeList") in (None, "", "(null)")
    states = cluster.node_states()
    assert all("drain" not in states[n] for n in nodes), states


KEEP = """#!/bin/bash
#SBATCH --output={work}/keep-%j.out
#JOBWRAP --stage-out=results:{dest}/out
set -e
mkdir -p "$JOBWRAP_SCRATCH/results"
echo precious > "$JOBWRAP_SCRATCH/results/data.txt"
# the user's own DEST, made unwritable before the job ends
mkdir -p {dest}
chmod 0555 {dest}
"""


def test_unwritable_stage_out_keeps_the_results(cluster: Cluster) -> None:
    dest = cluster.work / "keep-dest"
    job_id = cluster.submit(KEEP.format(work=cluster.work, dest=dest), name="keep.sh")
    try:
        info = cluster.wait_job(job_id, timeout=120)
        output = (cluster.work / f"keep-{job_id}.out").read_text()
    finally:
        if dest.exists():
            os.chmod(dest, 0o700)
    assert info["JobState"] == "COMPLETED", output
    assert not (dest / "out").exists()
    events = root_events(cluster, job_id)
    [record] = [e for e in events if e["event"] == "staging.kept"]
    node = str(record["node"])
    box = cluster.scratch_of(node) / ".quarantine" / job_id
    kept = box / "attempt0"
    assert (kept / "results" / "data.txt").read_text() == "precious\n", output
    user = pwd.getpwnam(cluster.spec.user)
    box_info, kept_info = os.lstat(box), os.lstat(kept)
    assert (box_info.st_uid, stat.S_IMODE(box_info.st_mode)) == (0, 0o711)
    assert (kept_info.st_uid, stat.S_IMODE(kept_info.st_mode)) == (user.pw_uid, 0o700)
    # the user is told what did not come back, why, where the results are, until when
    assert "jobwrap: stage-out did not bring back all results" in output, output
    assert str(kept) in output and "until" in output, output
    assert record["path"] == str(kept)
    assert "drain" not in cluster.node_states()[node]
    assert not any(p.exists() for p in cluster.scratch_paths(job_id))


KILLED_LINE = """#!/bin/bash
#SBATCH --output={work}/killedline-%j.out -w n1
#JOBWRAP --max-restarts=1000
echo "srun: error: n1: task 0: Killed"
echo Killed
exit 1
"""


def test_a_printed_killed_line_loosens_no_brake(cluster: Cluster) -> None:
    """Issue 22, item 5: ``echo Killed; exit 1`` was classed ``killed`` (not the job's
    fault): no same-error or no-progress stop, requeued up to --max-restarts, and counted
    against the node. The job's own words now make it only more the job's fault."""
    job_id = cluster.submit(KILLED_LINE.format(work=cluster.work), name="killedline.sh")
    info = cluster.wait_job(job_id, timeout=180)
    ends = [(e["attempt"], e["kind"], e["decision"]) for e in root_events(cluster, job_id)
            if e["event"] == "attempt.end"]
    assert info["JobState"] == "FAILED", info
    assert ends == [(0, "user_error", "requeue"), (1, "user_error", "stop")], ends


CANCEL_LINE = """#!/bin/bash
#SBATCH --output={work}/cancelline-%j.out -w n1
#JOBWRAP --max-restarts=3
echo "slurmstepd-n1: error: *** JOB $SLURM_JOB_ID ON n1 CANCELLED AT $(date +%FT%T) ***"
exit 1
"""


def test_a_printed_cancel_line_can_only_stop_the_job(cluster: Cluster) -> None:
    """slurmstepd's cancel line is the one sign of a scancel the epilog gets (Slurm hands it
    exit 0 and COMPLETING), and the job can print it. Printed by the job, it classes the
    attempt ``cancelled``: stopped, as an scancel of its own would; no requeue, nothing
    counted against the node, the node not drained."""
    job_id = cluster.submit(CANCEL_LINE.format(work=cluster.work), name="cancelline.sh")
    stopped_once_on_n1(cluster, job_id, "cancelled")


def stopped_once_on_n1(cluster: Cluster, job_id: str, kind: str) -> None:
    """The job failed at its first attempt, classed ``kind`` and stopped (no requeue), and
    n1, where it ran, is not drained."""
    info = cluster.wait_job(job_id, timeout=120)
    ends = [(e["attempt"], e["kind"], e["decision"]) for e in root_events(cluster, job_id)
            if e["event"] == "attempt.end"]
    assert info["JobState"] == "FAILED" and info["Restarts"] == "0", info
    assert ends == [(0, kind, "stop")], ends
    node = cluster.as_user(["scontrol", "show", "node", "n1"]).stdout
    assert "DRAIN" not in node, node


RUN_STOPPED = """#!/bin/bash
#SBATCH --output={work}/runstopped-%j.out -w n1
#JOBWRAP --max-restarts=3
line='"event":"run.stopped","attempt":0,"node":"n1","kind_ended":"user_error","reason":"x"'
printf '{{"ts":%s,%s}}\\n' "$(date +%s.%N)" "$line" \\
  >> {state}/jobs/$SLURM_JOB_ID/user-events.jsonl
exit 1
"""


def test_a_forged_run_stopped_can_only_stop_the_job(cluster: Cluster) -> None:
    """``run.stopped`` is the user's word that jobwrap run's brakes already stopped: the
    epilog then stops the job's own failure rather than requeue it. Forged, it only ends
    the forger's own job, with nothing counted against the node."""
    job_id = cluster.submit(RUN_STOPPED.format(work=cluster.work, state=cluster.state_in_script),
                            name="runstopped.sh")
    stopped_once_on_n1(cluster, job_id, "user_error")


SKIP_CLAIM = """#!/bin/bash
#SBATCH --output={work}/skipclaim-%j.out -N2
#JOBWRAP --max-restarts=1
for node in $(scontrol show hostnames "$SLURM_JOB_NODELIST") n4 nx; do
  echo "jobwrap: job $SLURM_JOB_ID did not start on $node: jobwrap's prolog did not run \\
on $node for attempt $JOBWRAP_ATTEMPT (slurmd before 23.02 skips it)"
done
exit 1
"""


def test_a_printed_skip_of_another_node_obtains_no_more_than_the_user_could(
        cluster: Cluster) -> None:
    """The task-prolog's line for a node of the job whose prolog Slurm skipped is the one
    word of it the first node's epilog gets: each node keeps its state to itself, so no
    record there can contradict it. Printed by the job itself, it obtains what the job's
    user may do to their own job without jobwrap, and no more: a requeue that leaves out
    a node of its own allocation (never the first node's own, never a node outside it),
    counted against --max-restarts; no node drained, none excluded for another job."""
    job_id = cluster.submit(SKIP_CLAIM.format(work=cluster.work), name="skipclaim.sh")
    info = cluster.wait_job(job_id, timeout=150)
    output = (cluster.work / f"skipclaim-{job_id}.out").read_text()
    ends = [e for e in root_events(cluster, job_id) if e["event"] == "attempt.end"]
    assert info["JobState"] == "FAILED" and info["Restarts"] == "1", (info, output)
    assert [(e["attempt"], e["decision"]) for e in ends] == [(0, "requeue"), (1, "stop")], \
        (ends, output)
    assert "restart limit reached" in ends[1]["reason"], ends[1]
    firsts = {e["attempt"]: e["node"] for e in ends}
    excluded = set(ends[0]["exclude"])
    # only the job's own other node of attempt 0: not its first node, not n4 nor nx
    assert excluded and excluded <= {"n1", "n2", "n3"} - {firsts[0]}, ends[0]
    held_out = cluster.job(job_id).get("ExcNodeList") or ""
    assert set(expand_hostlist("" if held_out == "(null)" else held_out)) <= \
        {"n1", "n2", "n3"}, held_out  # this job's own nodes only, for this job only
    states = cluster.node_states()
    assert all("drain" not in state for state in states.values()), states
