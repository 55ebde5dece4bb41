"""node-loss: a node lost whole mid-job, at the SlurmdTimeout sites run (300 s).

One sandbox of three nodes (Slurm's timers as in jobwrap's sandbox: SlurmdTimeout=300).
A two-rank toy job holds a spare (``jobwrap run --spare-nodes=1``: n1 and n2 work, n3
waits). Once it is at step 3, node n2 "loses power": its slurmd, the job's steps and
ranks on it and jobwrap's watcher of the job there are all stopped (SIGSTOP) at once.
Measured from that instant:

- ``detect_s``: until jobwrap knows (root's ``pulse.lost``), or, without the pulse, until
  Slurm's own record shows n2 DOWN or not responding;
- ``resume_s``: until the work is running again, on the spare (``attempt 1: resuming
  from`` in the job's output).

The subject runs with the pulse (its defaults: a beat each 0.5 s, lost after 4.5 s), the
anchor with ``[pulse] enabled = false``: the same job on Slurm's clock alone. Each anchor
run costs over five minutes, so it runs once (``NODE_LOSS_ANCHOR_RUNS``), after the
first of the pulse's ``NODE_LOSS_RUNS`` (3) runs. The last line has the worst pulse run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import statistics
import time
from pathlib import Path

import psutil

import jobwrap_dev.sandbox
from jobwrap_dev.sandbox.cluster import Cluster
from tests.bench.cluster import sandbox
from wrapper.runner import Runner

STEPS = 40
PAYLOAD = Path(jobwrap_dev.sandbox.__file__).parent / "toy_train.py"
RESUMED = "attempt 1: resuming from"


def _script(cluster: Cluster, name: str) -> str:
    jobwrap = cluster.runtime / "venv" / "bin" / "jobwrap"
    rank = ('D=$JOBWRAP_CHECKPOINT_DIR; '
            'if [ "$SLURM_PROCID" = 0 ]; then export TOY_PEER_DIR=$D-r1; else '
            'export TOY_PEER_DIR=$D JOBWRAP_CHECKPOINT_DIR=$D-r1; mkdir -p $D-r1; fi; '
            f'exec python3 train.py {STEPS} 0.4')
    return f"""#!/bin/bash
#SBATCH --output={name}-%j.out
#SBATCH -N2 --no-kill --ntasks-per-node=1 --gres=gpu:1
#JOBWRAP --checkpoint-dir=ckpt-{name} --spare-nodes=1 --max-restarts=0 --hang-timeout=30m
{jobwrap} run -- srun bash -c '{rank}'
"""


def _set_pulse(cluster: Cluster, enabled: bool) -> None:
    text = cluster.jobwrap_config.read_text().replace("[pulse]\nenabled = false\n", "[pulse]\n")
    if not enabled:
        text = text.replace("[pulse]\n", "[pulse]\nenabled = false\n")
    cluster.jobwrap_config.write_text(text)


def _frozen_node(cluster: Cluster, job_id: str, node: str) -> list[psutil.Process]:
    tasks = [p for p in psutil.process_iter(["environ"])
             if (p.info["environ"] or {}).get("SLURM_JOB_ID") == job_id
             and (p.info["environ"] or {}).get("SLURMD_NODENAME") == node]
    steps = {q.pid: q for p in tasks for q in p.parents() if q.name() == "slurmstepd"}
    watcher = cluster.watcher_pid(job_id, node)
    slurmd = next(d for d in cluster.daemons if d.name == f"slurmd-{node}")
    procs = [psutil.Process(slurmd.pid), *steps.values(), *tasks]
    return procs + ([psutil.Process(watcher)] if watcher else [])


def _slurm_lost(cluster: Cluster, node: str) -> bool:
    state = cluster.node_states().get(node, "")
    return state.startswith("down") or state.endswith("*")


def _one(cluster: Cluster, pulse: bool, run: int) -> tuple[float, float]:
    """(detect_s, resume_s) of one lost node."""
    _set_pulse(cluster, pulse)
    name = f"loss{run}{'p' if pulse else 's'}"
    for folder in (f"ckpt-{name}", f"ckpt-{name}-r1"):
        shutil.rmtree(cluster.work / folder, ignore_errors=True)
    job_id = cluster.submit(_script(cluster, name), name=f"{name}.sh")
    out = cluster.work / f"{name}-{job_id}.out"
    deadline = time.monotonic() + 120
    while "step 3 " not in (out.read_text() if out.exists() else ""):
        if time.monotonic() > deadline:
            raise RuntimeError(f"node-loss: the job never reached step 3: {out}")
        time.sleep(0.2)
    frozen = _frozen_node(cluster, job_id, "n2")
    lost_at = time.time()
    for proc in frozen:
        proc.send_signal(signal.SIGSTOP)
    detect = resume = 0.0
    try:
        deadline = time.monotonic() + (60 if pulse else 600)
        while time.monotonic() < deadline and not resume:
            now = time.time()
            if not detect:
                if pulse:
                    lost = [e for e in cluster.events(job_id, root_only=True)
                            if e["event"] == "pulse.lost"]
                    detect = float(lost[0]["ts"]) - lost_at if lost else 0.0
                elif _slurm_lost(cluster, "n2"):
                    detect = now - lost_at
            if RESUMED in out.read_text():
                resume = now - lost_at
            time.sleep(0.2)
        if not resume:
            raise RuntimeError(f"node-loss: the work never resumed ({out})")
        cluster.wait_job(job_id, timeout=180)
    finally:
        for proc in frozen:  # the node "reboots": its processes are gone
            with contextlib.suppress(psutil.Error):
                proc.kill()
        cluster.daemons[:] = [d for d in cluster.daemons if d.name != "slurmd-n2"]
        cluster.start_daemon("slurmd-n2")
        Runner(cluster.env()).run(["scontrol", "update", "NodeName=n2", "State=RESUME"],
                                  timeout=20, check=False)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not cluster.node_states().get(
                "n2", "").startswith("idle"):
            time.sleep(1)
    print(f"node-loss {'pulse' if pulse else 'slurm'} run {run}: detect {detect:.1f} s, "
          f"resume {resume:.1f} s", flush=True)
    return detect, resume


def main() -> int:
    runs = int(os.environ.get("NODE_LOSS_RUNS", "3"))
    anchors = int(os.environ.get("NODE_LOSS_ANCHOR_RUNS", "1"))
    with sandbox(gpus_per_node=1, nodes=3) as cluster:
        assert "SlurmdTimeout=300" in cluster.conf.read_text()
        cluster.write_user_file("train.py", PAYLOAD.read_text())
        pulse: list[tuple[float, float]] = []
        slurm: list[tuple[float, float]] = []
        for i in range(max(runs, anchors)):
            if i < runs:
                pulse.append(_one(cluster, True, i))
            if i < anchors:
                slurm.append(_one(cluster, False, i))
    detect = max(d for d, _ in pulse)
    resume = max(r for _, r in pulse)
    slurm_resume = statistics.median(r for _, r in slurm) if slurm else float("nan")
    print(f"node-loss pulse detect per run: {' '.join(f'{d:.1f}' for d, _ in pulse)}; "
          f"resume: {' '.join(f'{r:.1f}' for _, r in pulse)}; Slurm alone (SlurmdTimeout="
          f"300) detect: {' '.join(f'{d:.1f}' for d, _ in slurm)}, resume "
          f"{' '.join(f'{r:.1f}' for _, r in slurm)}")
    ok = detect <= 5.0 and resume <= 30.0
    print(f"node-loss detect_s={detect:.1f} resume_s={resume:.1f} "
          f"slurm_resume_s={slurm_resume:.1f} runs={len(pulse)} goal detect_s<=5 resume_s<=30")
    return 0 if ok else 1
