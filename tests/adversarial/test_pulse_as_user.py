"""The job's user against the pulse (wrapper/pulse/, docs/security.md row 36): the hub's
ports are ordinary TCP ports on the job's first node, which the user's processes can
bind before the hub and connect to while it runs. Root's pulse trusts only MUNGE
credentials that root made for this job's attempt, so what the user obtains is at most a
job of their own without a pulse (Slurm's clocks): no node is judged lost, set DOWN or
fenced, and the job itself runs to its end."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time

from jobwrap_dev.sandbox.cluster import Cluster
from wrapper import config
from wrapper.pulse.wire import candidates

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT"}

JOB = """#!/bin/bash
#SBATCH --output={name}-%j.out -N2 --ntasks-per-node=1
#JOBWRAP --max-restarts=0
srun bash -c 'for i in $(seq 25); do echo "rank $SLURM_PROCID $i"; sleep 1; done'
"""

# As the job's user: hold the job's hub ports and answer every comer as "the hub", with
# the user's own credential (the only kind a user can make).
SQUAT = r"""
import socket, subprocess, sys, threading, json
job, ports = sys.argv[1], [int(p) for p in sys.argv[2:]]
def answer(conn):
    with conn:
        conn.recv(4096)
        said = json.dumps({"v": 1, "role": "hub", "job": job, "attempt": 0, "node": "n1"},
                          separators=(",", ":"))
        cred = subprocess.run(["munge", "-s", said], capture_output=True).stdout.strip()
        conn.sendall(b"HELLO " + cred + b"\n")
        conn.recv(4096)
def serve(sock):
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=answer, args=(conn,), daemon=True).start()
for port in ports:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(16)
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print("squatting", flush=True)
threading.Event().wait()
"""

# As the job's user: connect to the hub's ports and speak as node n2 (hellos signed with
# the user's credential, a replayed-looking one, beats without a hello, a fence notice)
# and keep idle connections open, for 15 s.
FLOOD = r"""
import json, socket, subprocess, sys, time
job, ports = sys.argv[1], [int(p) for p in sys.argv[2:]]
said = json.dumps({"v": 1, "role": "beat", "job": job, "attempt": 0, "node": "n2"},
                  separators=(",", ":"))
idle, sent, end = [], 0, time.time() + 15
while time.time() < end:
    cred = subprocess.run(["munge", "-s", said], capture_output=True).stdout.strip()
    for port in ports:
        for line in (b"HELLO " + cred, b"HELLO " + cred, b"B 1", b"FENCING",
                     b"HELLO MUNGE:" + b"A" * 300):
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=0.5)
                s.sendall(line + b"\n")
                sent += 1
                (idle.append(s) if len(idle) < 40 else s.close())
            except OSError:
                pass
    time.sleep(0.05)
print(f"sent {sent}", flush=True)
"""


def _ports(cluster: Cluster, job_id: str) -> list[str]:
    cfg = config.load(str(cluster.jobwrap_config), node="n1")
    return [str(p) for p in candidates(job_id, 0, config.port_range(cfg.pulse.ports))]


def _as_user(cluster: Cluster, code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(["runuser", "-u", cluster.spec.user, "--", "python3", "-c", code,
                             *args], stdout=subprocess.PIPE, text=True, cwd=cluster.work)


def _end(proc: subprocess.Popen[str]) -> None:
    """End what this test started: runuser and the user's process under it, by pid."""
    import psutil

    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.send_signal(signal.SIGKILL)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _pulse_events(cluster: Cluster, job_id: str) -> list[str]:
    return [str(e["event"]) for e in cluster.events(job_id, root_only=True)
            if str(e["event"]).startswith("pulse.")]


def _no_node_down(cluster: Cluster) -> None:
    states = cluster.node_states()
    assert not any(s.startswith(("down", "drain")) for s in states.values()), states


def test_a_user_holding_the_hubs_ports_gets_a_job_without_a_pulse_and_nothing_else(
        cluster: Cluster) -> None:
    job_id = cluster.submit(JOB.format(name="squat"), "--hold", name="squat.sh")
    squatter = _as_user(cluster, SQUAT, job_id, *_ports(cluster, job_id))
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "squatting"
        cluster.as_user(["scontrol", "release", job_id])
        info = cluster.wait_job(job_id, states=TERMINAL, timeout=120)
        out = (cluster.work / f"squat-{job_id}.out").read_text()
        assert info["JobState"] == "COMPLETED", out
        assert "rank 1 25" in out, out
        assert _pulse_events(cluster, job_id) == []  # no lease was ever given: no fence
        assert '"pulse.off"' in cluster.log_of("n1").read_text()
        _no_node_down(cluster)
    finally:
        _end(squatter)


def test_a_user_speaking_for_a_node_at_the_hub_is_not_heard(cluster: Cluster) -> None:
    job_id = cluster.submit(JOB.format(name="flood"), name="flood.sh")
    deadline = time.monotonic() + 60
    while cluster.wait_job(job_id, states=TERMINAL | {"RUNNING"}, timeout=60)["JobState"] \
            != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(3)  # the hub is up and n2 beats
    flood = _as_user(cluster, FLOOD, job_id, *_ports(cluster, job_id))
    out, _ = flood.communicate(timeout=60)
    assert out.startswith("sent ") and int(out.split()[1]) > 100, out
    info = cluster.wait_job(job_id, states=TERMINAL, timeout=120)
    output = (cluster.work / f"flood-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED", output
    assert "rank 1 25" in output, output
    assert _pulse_events(cluster, job_id) == []
    log = cluster.log_of("n1").read_text()
    joined = [line for line in log.splitlines()
              if '"pulse.joined"' in line and f'"job_id": "{job_id}"' in line]
    assert len(joined) == 1 and '"joined_node": "n2"' in joined[0], joined  # only root's n2
    _no_node_down(cluster)
