"""The job's user against the pulse's samples of its ranks (wrapper/watch/ranks.py and
judge.py, docs/security.md row 37): root reads the user's processes every few seconds
and names a stuck rank in root's record. What the user's processes say of themselves
(their environment, command line, file and function names) is the user's text; what they
cost root must stay bounded (at most 512 processes and 64 ranks read); and nothing of
another user is ever sampled or named.
"""

from __future__ import annotations

import json

from jobwrap_dev.sandbox.cluster import Cluster
from tests.adversarial.conftest import rival_claiming
from wrapper.osl.users import UserIds

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT"}
WAITER = "import time\ndef all_reduce():\n    time.sleep(600)\nall_reduce()\n"
# rank 1 is stuck in a function whose name is 300 characters, in a file whose name holds
# terminal escapes; 300 of the job's own processes each carry a 200 KB environment
FLOOD = r"""#!/bin/bash
#SBATCH --output=flood-%j.out -N1 -w n1
#JOBWRAP --max-restarts=0
RANK=0 python3 waiter.py &
mkdir -p evil
name="evil/$(printf 'x\033[2J\a')$(head -c 180 /dev/zero | tr '\0' 'y').py"
fn=$(head -c 300 /dev/zero | tr '\0' 'z')
printf 'import time\ndef %s():\n    time.sleep(600)\n%s()\n' "$fn" "$fn" > "$name"
RANK=1 python3 "$name" &
sleep 2
big=$(head -c 200000 /dev/zero | tr '\0' 'E')
for i in $(seq 1 300); do BIG=$big sleep 600 & done
wait
"""
RIVAL = "import time\ndef rival_idle():\n    time.sleep(300)\nrival_idle()\n"


def test_a_flood_and_hostile_names_stay_bounded_and_no_rival_is_named(
        cluster: Cluster, rival: UserIds) -> None:
    cluster.write_user_file("waiter.py", WAITER)
    job_id = cluster.submit(FLOOD, name="flood.sh")
    cluster.wait_job(job_id, states={"RUNNING"}, timeout=60)
    # the rival's idle process claims to be rank 1 of the job, on its node
    with rival_claiming(rival, job_id, "n1", 1, ["python3", "-c", RIVAL]) as forged:
        info = cluster.wait_job(job_id, states=TERMINAL, timeout=180)
    events = cluster.events(job_id)
    [verdict] = [e for e in events if e["event"] == "pulse.hang" and e["source"] == "root"]
    [named] = verdict["stuck"]
    pid = int(str(named).split("(pid ")[1].split()[0])
    assert pid not in forged, (named, forged)
    assert str(named).startswith("rank 1 (pid ") and str(named).isprintable(), named
    assert len(str(named)) <= 300 and "rival_idle" not in json.dumps(events), named
    assert verdict["ranks"] == 2, verdict  # the job's two ranks; no sleep, no rival
    hang = [e for e in events if e["event"] == "hang"]
    assert hang and hang[0]["found_by"] == "pulse", hang
    assert info["JobState"] != "COMPLETED", info
    # the flooded node's samples kept coming, each bounded to the 256 processes' and 64
    # ranks' reads (their time is the benchmarks', not a test's); only the job's ranks
    # were ranks
    sampled = [json.loads(line) for line in
               cluster.log_of("n1").read_text(errors="replace").splitlines()
               if '"pulse.sampled"' in line and f'"job_id": "{job_id}"' in line]
    assert len(sampled) >= 4 and max(s["ranks"] for s in sampled) == 2, sampled
