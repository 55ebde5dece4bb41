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

from wrapper.osl.users import UserIds
from wrapper.sandbox.cluster import Cluster
from wrapper.state import JobState

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
    events = JobState(cluster.state_dir, job_id).events()
    hang = [e for e in events if e["event"] == "hang"]
    taken = [e for e in events if e["event"] == "watch.forensics" and e["source"] == "root"]
    assert hang and taken, (info, [e["event"] for e in events])
    pids = [r["pid"] for e in taken for r in e["ranks"]]
    assert not set(pids) & {forger.pid, *forged}, (pids, forged)
    kept = JobState(cluster.state_dir, job_id).path / "forensics-n1.json"
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
