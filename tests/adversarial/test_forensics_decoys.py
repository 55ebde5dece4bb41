"""Hang forensics are root's: the ordinary user cannot aim them at anyone else's process,
nor stall them.

The job user's rival starts a process whose environment claims the job's SLURM_JOB_ID,
hoping root runs py-spy against it (and puts its stack in the job's archive); the job
itself keeps a decoy it stopped with SIGSTOP beside its hung rank. Root must read only the
job user's own processes, with that user's rights, and end the hung job on time.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time

import psutil

from jobwrap_dev.sandbox.cluster import Cluster
from wrapper.osl.users import UserIds

HUNG = '''#!/bin/bash
#SBATCH --output=fx-%j.out
#JOBWRAP --hang-timeout=8s --max-restarts=0
python3 -c "import os,signal,time
def decoy_stopped(): os.kill(os.getpid(), signal.SIGSTOP); time.sleep(600)
decoy_stopped()" &
python3 -c "import time
def hung_rank(): print('up', flush=True); time.sleep(600)
hung_rank()"
'''
RIVAL = "import time\ndef rival_secret(): time.sleep(300)\nrival_secret()"


def test_root_reads_no_rivals_process_and_a_stopped_decoy_stalls_nothing(
        cluster: Cluster, rival: UserIds) -> None:
    job_id = cluster.submit(HUNG, name="fx.sh")
    forger = subprocess.Popen(["runuser", "-u", rival.name, "--", "env",
                               f"SLURM_JOB_ID={job_id}", "RANK=0", "python3", "-c", RIVAL],
                              cwd="/tmp")
    forged: list[int] = []
    try:
        time.sleep(1)
        forged = [c.pid for c in psutil.Process(forger.pid).children(recursive=True)]
        info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED", "CANCELLED"},
                                timeout=180)
    finally:
        for pid in forged:  # the rival's python, started by this test
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        forger.kill()
        forger.wait()
    assert forged, "the rival's process did not start"
    events = cluster.events(job_id)
    hang = [e for e in events if e["event"] == "hang"]
    taken = [e for e in events if e["event"] == "watch.forensics" and e["source"] == "root"]
    assert hang and taken, (info, [e["event"] for e in events])
    pids = [r["pid"] for e in taken for r in e["ranks"]]
    assert not set(pids) & {forger.pid, *forged}, (pids, forged)
    # the node the job ran on (n1 unless an earlier test's job still holds it)
    [node] = {e["node"] for e in taken}
    kept = cluster.job_state(job_id).path / f"forensics-{node}.json"
    blob = json.dumps(taken) + kept.read_text()
    assert "rival_secret" not in blob, blob
    read = [r for e in taken for r in e["ranks"] if r.get("signature")]
    assert any("hung_rank" in r["signature"] for r in read), taken
    # The decoy is the job user's own stopped process: read or not, it cost no more than
    # the forensics' bound, and the hung job still ended.
    ended = [e for e in events if e["event"] == "attempt.end" and e["source"] == "root"]
    assert ended and ended[0]["kind"] == "hang", ended
    assert ended[0]["ts"] - hang[0]["ts"] < 30 + 20, (hang, ended)
    out = (cluster.work / f"fx-{job_id}.out").read_text()
    assert "hang forensics of attempt 0" in out, out


BIG_RANKS = '''#!/bin/bash
#SBATCH --output=fxbig-%j.out
#JOBWRAP --hang-timeout=8s --max-restarts=0
big=$(head -c 120000 /dev/zero | tr '\\0' 'R')
for i in $(seq 1 16); do
  RANK="$big$i" python3 -c "import time; time.sleep(600)" &
done
python3 -c "import time
def hung_rank(): print('up', flush=True); time.sleep(600)
hung_rank()"
'''


def test_rank_labels_from_the_environment_cannot_grow_roots_record(cluster: Cluster) -> None:
    """Issue 22, item 7: 64 processes with a 128 KiB RANK each once wrote an 8 MiB
    ``watch.forensics`` line; past ROOT_EVENTS_MAX every reader silently lost root's
    earliest events. Labels are cut, and every root line is bounded."""
    job_id = cluster.submit(BIG_RANKS, name="fxbig.sh")
    cluster.wait_job(job_id, states={"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
    taken = [e for e in cluster.events(job_id) if e["event"] == "watch.forensics"
             and e["source"] == "root"]
    assert taken and len(taken[0]["ranks"]) >= 16, taken
    labels = [r["rank"] for r in taken[0]["ranks"] if r["rank"] is not None]
    assert labels and all(len(label) <= 24 for label in labels), labels
    lines = [line for node in cluster.spec.nodes
             if (cluster.job_state(job_id, node).path / "events.jsonl").exists()
             for line in (cluster.job_state(job_id, node).path / "events.jsonl"
                          ).read_bytes().splitlines()]
    assert max(len(line) for line in lines) <= 256 << 10  # wrapper.job.state.LINE_MAX
    assert sum(len(line) for line in lines) < 1 << 20, sum(len(line) for line in lines)
    ended = [e for e in cluster.events(job_id, root_only=True) if e["event"] == "attempt.end"]
    assert ended and ended[0]["kind"] == "hang", ended
