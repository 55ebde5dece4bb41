"""The job's user frames a node as slow (wrapper/pulse/judge.py ``SlowJudge``, docs/
security.md row 38). The speed score is made from the job's own processes, which their
user shapes: a rank that spins on its CPU is slow to the judge, wherever it runs. So the
user's job can name any node it runs on; what must hold is that the naming is only a
record: no node is drained or set down, the job is not ended, another user's process
claiming a rank of the job is never read, and ``jobwrap report`` says how many users'
jobs named the node, so one user's jobs alone are told apart from a node many find slow.
A site that drains slow nodes ([pulse] slow_drain_users) needs two users' jobs at least:
this user's never drain n2, and a config that would let them is refused.
"""

from __future__ import annotations

import json
import subprocess
import time

from jobwrap_dev.sandbox.cluster import Cluster
from tests.adversarial.conftest import rival_claiming
from wrapper.osl.users import UserIds

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT"}
# a "rank" on a CPU ``duty`` of every second; on n2 all of it: the one the others wait on
RANK = """import os, sys, time
duty = float(sys.argv[1])
while True:
    end = time.monotonic() + duty
    while time.monotonic() < end:
        pass
    time.sleep(1 - duty)
"""
JOB = """#!/bin/bash
#SBATCH --output=frame-%j.out -N3 --ntasks-per-node=1 -c 2 --mem=0
#JOBWRAP --max-restarts=0 --hang-timeout=off
srun bash -c 'if [ $SLURMD_NODENAME = n2 ]; then d=1.0; else d=0.3; fi
RANK=$SLURM_NODEID exec python3 rank.py $d'
"""


def test_a_user_framing_a_node_slow_gets_only_a_record(cluster: Cluster,
                                                        rival: UserIds) -> None:
    cluster.write_user_file("rank.py", RANK)
    job_id = cluster.submit(JOB, name="frame.sh")
    cluster.wait_job(job_id, states={"RUNNING"}, timeout=60)
    # the rival spins too, claiming to be the job's rank on n3: were it read, n3's rank
    # would look as busy as n2's
    with rival_claiming(rival, job_id, "n3", 2, ["python3", "-c", RANK, "0.5"]):
        deadline, named = time.monotonic() + 180, []
        while not named and time.monotonic() < deadline:
            named = [e for e in cluster.events(job_id, root_only=True)
                     if e["event"] == "pulse.slow"]
            time.sleep(2)
        time.sleep(6)  # two more samples: a second node named would be by now
        named = [e for e in cluster.events(job_id, root_only=True)
                 if e["event"] == "pulse.slow"]
        running = cluster.wait_job(job_id, states={"RUNNING"}, timeout=5)["JobState"]
        states = cluster.node_states()
    cluster.as_user(["scancel", job_id], check=False)
    cluster.wait_job(job_id, states=TERMINAL, timeout=120)
    assert [e["slow"] for e in named] == ["n2"], named
    assert running == "RUNNING", running  # jobwrap ended nothing
    assert not any(s.startswith(("drain", "down")) for s in states.values()), states
    sampled = [json.loads(line) for line in
               cluster.log_of("n3").read_text(errors="replace").splitlines()
               if '"pulse.sampled"' in line and f'"job_id": "{job_id}"' in line]
    assert sampled and max(s["ranks"] for s in sampled) == 1, sampled  # not the rival's
    deadline, n2 = time.monotonic() + 60, {}
    while not n2.get("slow") and time.monotonic() < deadline:  # the epilogs archive it
        report = subprocess.run([str(cluster.runtime / "venv" / "bin" / "jobwrap"),
                                 "--config", str(cluster.jobwrap_config), "report", "--json"],
                                capture_output=True, text=True, env=cluster.env(),
                                timeout=60, check=False)
        assert report.returncode == 0, report.stderr
        n2 = json.loads(report.stdout)["report"]["nodes"].get("n2", {})
        time.sleep(1)
    assert n2.get("slow", 0) >= 1 and n2["slow_users"] == 1, n2
    # A site that drains slow nodes ([pulse] slow_drain_users, 2 at least): one user's jobs
    # never reach it, and a config asking 1 is refused.
    site = cluster.base / "etc" / "jobwrap-slow-drain.toml"
    for users, said in ((2, ""), (1, "slow_drain_users = 1: one user's jobs would drain")):
        site.write_text(cluster.jobwrap_config.read_text().replace(
            "[pulse]\n", f"[pulse]\nslow_drain_users = {users}\n"))
        site.chmod(0o644)
        indexed = subprocess.run([str(cluster.runtime / "venv" / "bin" / "jobwrap"),
                                  "--config", str(site), "archive", "index"],
                                 capture_output=True, text=True, env=cluster.env(),
                                 timeout=60, check=False)
        assert said in indexed.stderr and "drained" not in indexed.stderr, indexed.stderr
        assert indexed.returncode == (2 if said else 0), indexed.stderr
        assert not cluster.node_states()["n2"].startswith(("drain", "down"))
    site.unlink()
