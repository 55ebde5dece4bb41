"""Spare nodes: a job holding one (``#JOBWRAP --spare-nodes=1``) on the sandbox's three
nodes (two working + one spare) keeps going inside its allocation when a working node
fails: the node is given back, drained with its reason, and the work restarts from the
latest checkpoint on the healthy node and the spare, with no requeue."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest

import jobwrap_dev.sandbox
from jobwrap_dev.sandbox.cluster import Cluster
from wrapper.runner import Runner

STEPS = 14
EXPECTED = STEPS * (STEPS + 1) // 2
LOSS_STEPS = 20
PAYLOAD = Path(jobwrap_dev.sandbox.__file__).parent / "toy_train.py"


@pytest.fixture(scope="module")
def payload(cluster: Cluster) -> str:
    return str(cluster.write_user_file("train.py", PAYLOAD.read_text()))


def spare_script(cluster: Cluster, name: str, steps: int = STEPS, extra: str = "") -> str:
    jobwrap = cluster.runtime / "venv" / "bin" / "jobwrap"
    # rank 0 keeps the checkpoints jobwrap resumes from; rank 1 trains beside it (its
    # own folder), the two in lockstep as a collective keeps them
    rank = ('echo "rank $SLURM_PROCID on $SLURMD_NODENAME"; D=$JOBWRAP_CHECKPOINT_DIR; '
            'if [ "$SLURM_PROCID" = 0 ]; then export TOY_PEER_DIR=$D-r1; else '
            'export TOY_PEER_DIR=$D JOBWRAP_CHECKPOINT_DIR=$D-r1; mkdir -p $D-r1; fi; '
            f'exec python3 train.py {steps} 0.4')
    return f"""#!/bin/bash
#SBATCH --output={name}-%j.out
#SBATCH -N2 --no-kill --ntasks-per-node=1 --gres=gpu:1
#JOBWRAP --checkpoint-dir=ckpt-{name} --spare-nodes=1 --max-restarts=0 {extra}
{jobwrap} run -- srun bash -c '{rank}'
"""


def wait_for(path: Path, text: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = path.read_text() if path.exists() else ""
        if text in found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in {path} within {timeout:g} s: {found}")


def test_a_gpu_fault_moves_the_work_to_the_spare_inside_the_allocation(
        cluster: Cluster, payload: str) -> None:
    name = "spare"
    for folder in (f"ckpt-{name}", f"ckpt-{name}-r1"):
        shutil.rmtree(cluster.work / folder, ignore_errors=True)
    job_id = cluster.submit(spare_script(cluster, name), name=f"{name}.sh")
    out = cluster.work / f"{name}-{job_id}.out"
    text = wait_for(out, "step 3 ", 90)
    assert "working on 2 of the job's 3 nodes; 1 spare (n3)" in text, text
    assert "rank 1 on n2" in text and "n3" not in text.split("1 spare (n3)")[1], text
    gpus = next(e for e in cluster.events(job_id) if e["event"] == "prolog.context"
                and e["node"] == "n2")["context"]["gpus"]
    try:
        cluster.set_gpu_faults("n2", {g: {"xid_events": (79,)} for g in gpus})
        info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED", "CANCELLED"},
                                timeout=150)
        output = out.read_text()
        assert info["JobState"] == "COMPLETED", output
        assert info["Restarts"] == "0", output  # never requeued: it kept its allocation
        assert f"done sum {EXPECTED}" in output, output  # no step lost or done twice
        assert "gave it back and restarted on n1,n3 (spare n3 took its place; " \
            "0 spare left)" in output, output
        assert "rank 1 on n3" in output, output
        assert "attempt 1: resuming from" in output, output
        events = cluster.events(job_id)
        [used] = [e for e in events if e["event"] == "run.spare_used"]
        assert (used["failed"], used["replaced_by"]) == (["n2"], ["n3"])
        assert "xid" in used["reason"], used
        ends = [e for e in events if e["event"] == "attempt.end" and e["source"] == "root"]
        assert [(e["kind"], e["decision"]) for e in ends] == [("success", "done")], ends
        status = subprocess.run([str(cluster.runtime / "venv" / "bin" / "jobwrap"), "--config",
                                 str(cluster.jobwrap_config), "status", job_id],
                                capture_output=True, text=True, env=cluster.env(), timeout=60,
                                check=False).stdout
        assert "job " + job_id + ": 1 attempt, finished: success" in status, status
        assert "incident     moved onto spare n3: n2: " in status, status
        assert "spares       1 held (" in status and "used 1, each a requeue avoided" in status
        drained = Runner(cluster.env()).run(["sinfo", "-h", "-N", "-n", "n2", "-o", "%T|%E"],
                                            timeout=10).stdout.strip()
        assert drained.startswith("drain") and "|jobwrap: xid gpu" in drained, drained
    finally:
        cluster.set_gpu_faults("n2")
        Runner(cluster.env()).run(["scontrol", "update", "NodeName=n2", "State=RESUME"],
                                  timeout=20, check=False)
        cluster.wait_idle(timeout=60)


def _node_processes(cluster: Cluster, node: str, job_id: str) -> list[psutil.Process]:
    """What runs for ``job_id`` on ``node``: its ranks, their slurmstepd and the node's
    root watcher of the job (its pid from the node's own state folder)."""
    tasks = [p for p in psutil.process_iter(["environ"])
             if (p.info["environ"] or {}).get("SLURM_JOB_ID") == job_id
             and (p.info["environ"] or {}).get("SLURMD_NODENAME") == node]
    steps = {q.pid: q for p in tasks for q in p.parents() if q.name() == "slurmstepd"}
    watcher = cluster.watcher_pid(job_id, node)
    assert watcher is not None, f"no watcher of {job_id} on {node}"
    return [psutil.Process(watcher), *steps.values(), *tasks]


def test_a_node_lost_whole_is_replaced_by_the_spare_in_seconds_at_the_sites_timeout(
        cluster: Cluster, payload: str) -> None:
    """n2 "loses power" mid-job: its slurmd, its job steps, its ranks and jobwrap's watcher
    on it stop at once. Slurm runs SlurmdTimeout=300 as sites do; the job's pulse (its
    watchers' beats to the first node's) finds n2 lost in seconds, sets it DOWN, and
    the spare takes over long before Slurm would have noticed."""
    import os
    import signal

    name = "spareloss"
    for folder in (f"ckpt-{name}", f"ckpt-{name}-r1"):
        shutil.rmtree(cluster.work / folder, ignore_errors=True)
    assert "SlurmdTimeout=300" in cluster.conf.read_text()
    frozen: list[psutil.Process] = []
    slurmd = next(d for d in cluster.daemons if d.name == "slurmd-n2")
    try:
        job_id = cluster.submit(spare_script(cluster, name, LOSS_STEPS, "--hang-timeout=5m"),
                                name=f"{name}.sh")
        out = cluster.work / f"{name}-{job_id}.out"
        wait_for(out, "step 3 ", 90)
        frozen = _node_processes(cluster, "n2", job_id)
        lost_at = time.time()
        os.kill(slurmd.pid, signal.SIGSTOP)
        for proc in frozen:
            proc.send_signal(signal.SIGSTOP)
        info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED", "CANCELLED",
                                                "NODE_FAIL"}, timeout=180)
        output = out.read_text()
        assert info["JobState"] == "COMPLETED", output
        assert info["Restarts"] == "0", output
        assert f"done sum {LOSS_STEPS * (LOSS_STEPS + 1) // 2}" in output, output
        assert "attempt 1: resuming from" in output, output
        assert "n2: Slurm lost it" in output and "spare n3 took its place" in output, output
        assert "rank 1 on n3" in output, output
        lost = [e for e in cluster.events(job_id, root_only=True) if e["event"] == "pulse.lost"]
        down = [e for e in cluster.events(job_id, root_only=True) if e["event"] == "pulse.down"]
        assert [e["lost"] for e in lost] == ["n2"] and [e["lost"] for e in down] == ["n2"]
        assert not down[0]["error"], down
        assert lost[0]["ts"] - lost_at < 10, "seconds, not SlurmdTimeout's 300"
        status = subprocess.run([str(cluster.runtime / "venv" / "bin" / "jobwrap"), "--config",
                                 str(cluster.jobwrap_config), "status", job_id],
                                capture_output=True, text=True, env=cluster.env(), timeout=60,
                                check=False).stdout
        assert "incident     n2 lost: no heartbeat for " in status, status
        assert "incident     n2 set DOWN in Slurm" in status, status
    finally:
        for proc in frozen:  # the node "reboots": its processes are gone
            with contextlib.suppress(psutil.Error):
                proc.kill()
        os.kill(slurmd.pid, signal.SIGKILL)
        cluster.daemons.remove(slurmd)
        cluster.start_daemon("slurmd-n2")
        Runner(cluster.env()).run(["scontrol", "update", "NodeName=n2", "State=RESUME"],
                                  timeout=20, check=False)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not cluster.node_states().get(
                "n2", "").startswith("idle"):
            time.sleep(1)
        cluster.wait_idle(timeout=60)
