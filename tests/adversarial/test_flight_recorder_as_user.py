"""The job's user against the flight-recorder read (wrapper/watch/flight.py, docs/
security.md row 39): root's watcher reads the dumps the job's ranks leave in
``$JOBWRAP_SCRATCH/.flight-recorder`` every sample, in a child as the user. The user
plants there a pickle that runs a command when loaded, a link to a dump only root may
read, a FIFO nobody writes and a file past the size bound (a folder swapped for a link
is tests/unit/watch/test_flight.py's). What must hold: nothing of the pickle runs,
nothing behind the link is read, the sampler never blocks, and the job's hang is still
found and its stuck rank named.
"""

from __future__ import annotations

import json
from pathlib import Path

from jobwrap_dev.sandbox.cluster import Cluster

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "flight" / "gloo-3ranks"

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT"}
WAITER = "import time\ndef all_reduce():\n    time.sleep(600)\nall_reduce()\n"
STUCK = "import time\ndef stuck_here():\n    time.sleep(600)\nstuck_here()\n"
# what a pickle runs when loaded: a marker in the job's folder
EVIL = r"""import os, pickle, sys
class Evil:
    def __reduce__(self):
        return (os.system, ("touch " + sys.argv[2],))
with open(sys.argv[1], "wb") as f:
    pickle.dump({"entries": [Evil()]}, f)
"""
JOB = r"""#!/bin/bash
#SBATCH --output=frec-%j.out -N1 -w n1
#JOBWRAP --max-restarts=0
SECRET=@SECRET@
d=$JOBWRAP_SCRATCH/.flight-recorder
python3 evil.py "$d/rank_0" "$PWD/pickle-ran-$SLURM_JOB_ID"
ln -s "$SECRET" "$d/rank_1"
mkfifo "$d/rank_2"
truncate -s 9M "$d/rank_3"
RANK=0 python3 waiter.py &
RANK=1 python3 stuck.py &
wait
"""


def test_hostile_dumps_neither_run_nor_leak_nor_block(cluster: Cluster) -> None:
    for name, text in (("evil.py", EVIL), ("waiter.py", WAITER), ("stuck.py", STUCK)):
        cluster.write_user_file(name, text)
    # a real dump only root may read: were it read through the link, its rank would count
    secret = cluster.base / "secret-dump"
    secret.write_bytes((FIXTURES / "rank_0").read_bytes())
    secret.chmod(0o600)
    job_id = cluster.submit(JOB.replace("@SECRET@", str(secret)), name="frec.sh")
    info = cluster.wait_job(job_id, states=TERMINAL, timeout=180)
    events = cluster.events(job_id)
    verdicts = [e for e in events if e["event"] == "pulse.hang" and e["source"] == "root"]
    assert len(verdicts) == 1, (info, events[-5:])
    [named] = verdicts[0]["stuck"]
    assert str(named).startswith("rank 1 (pid ") and "stuck_here" in str(named), named
    assert verdicts[0]["flight"] == [], verdicts  # nothing the recorder wrote: no word
    assert not (cluster.work / f"pickle-ran-{job_id}").exists()  # the pickle never ran
    read = [r for e in events if e["event"] == "watch.forensics" and e["node"] == "n1"
            for r in e["flight"]]
    assert read and not any("groups" in r for r in read), read  # each refused, one reason
    sampled = [json.loads(line) for line in
               cluster.log_of("n1").read_text(errors="replace").splitlines()
               if '"pulse.sampled"' in line and f'"job_id": "{job_id}"' in line]
    assert len(sampled) >= 4, sampled  # the samples kept coming: no read blocked them
