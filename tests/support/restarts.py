"""A real 2-node job for the tests that restart Slurm's daemons under it (the toy loop as
two ranks in lockstep, one srun task per node), and the restarts themselves, as a site's
``systemctl restart slurmd`` does them."""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path

import psutil

import jobwrap_dev.sandbox
from jobwrap_dev.sandbox.cluster import Cluster
from tests.support import poll
from wrapper.runner import Runner
from wrapper.watch.files import pid_file

STEPS = 40
EXPECTED = STEPS * (STEPS + 1) // 2
PAYLOAD = Path(jobwrap_dev.sandbox.__file__).parent / "toy_train.py"


def write_payload(cluster: Cluster) -> str:
    """The toy loop, written for the test user as ``train.py`` in the sandbox's work folder."""
    return str(cluster.write_user_file("train.py", PAYLOAD.read_text()))


def script(name: str) -> str:
    # rank 0 keeps the checkpoints jobwrap resumes from, rank 1 its own beside them; a
    # second step launched after the restart shows that slurmd still starts new steps
    # (and that the task-prolog still finds the attempt's prolog record on both nodes)
    rank = ('D=$JOBWRAP_CHECKPOINT_DIR; if [ "$SLURM_PROCID" = 0 ]; then '
            'export TOY_PEER_DIR=$D-r1; else export TOY_PEER_DIR=$D '
            f'JOBWRAP_CHECKPOINT_DIR=$D-r1; mkdir -p $D-r1; fi; exec python3 train.py {STEPS} 0.4')
    return f"""#!/bin/bash
#SBATCH --output={name}-%j.out
#SBATCH -N2 --ntasks-per-node=1 --gres=gpu:1
#JOBWRAP --checkpoint-dir=ckpt-{name} --max-restarts=2
srun bash -c '{rank}'
srun bash -c 'echo "attempt $JOBWRAP_ATTEMPT: a new step on $SLURMD_NODENAME"'
"""


def last_step(out: Path) -> int:
    text = out.read_text() if out.exists() else ""
    steps = [int(line.split()[1]) for line in text.splitlines()
             if line.startswith("step ") and line.split()[1].isdigit()]
    return max(steps, default=0)


def processes(cluster: Cluster, job_id: str, nodes: list[str]) -> dict[str, tuple[int, float]]:
    """The attempt's supervisor (its own ``supervisor.start``) and each node's watcher (its
    pid file): name -> (pid, start time); empty until all of them are there."""
    pids = {f"supervisor {e['pid']}": int(e["pid"]) for e in cluster.events(job_id)
            if e["event"] == "supervisor.start" and e.get("attempt") == 0}
    for node in nodes:
        record = cluster.job_state(job_id, node).read_json(pid_file(node))
        if record:
            pids[f"watcher {node}"] = int(record["pid"])
    if len(pids) != 1 + len(nodes):
        return {}
    out = {}
    for name, pid in pids.items():
        with contextlib.suppress(psutil.Error):
            out[name] = (pid, psutil.Process(pid).create_time())
    return out if len(out) == len(pids) else {}


def alive(procs: dict[str, tuple[int, float]]) -> dict[str, bool]:
    def same(pid: int, started: float) -> bool:
        try:
            proc = psutil.Process(pid)
            return proc.create_time() == started and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    return {name: same(*procs[name]) for name in procs}


def slurmd_start(cluster: Cluster, node: str) -> str:
    res = Runner(cluster.env()).run(["scontrol", "show", "node", node], timeout=20,
                                    check=False)
    return next((w.split("=", 1)[1] for w in res.stdout.split()
                 if w.startswith("SlurmdStartTime=")), "")


def restart_slurmd(cluster: Cluster, nodes: list[str]) -> None:
    """``systemctl restart slurmd`` on each node: stop (SIGTERM; it must exit by itself)
    every one first, so the job is without any slurmd for a moment, then start each with
    the sandbox's own argv; return once slurmctld has heard from each new slurmd."""
    before = {node: slurmd_start(cluster, node) for node in nodes}
    time.sleep(1.1)  # SlurmdStartTime has a resolution of one second
    for node in nodes:
        cluster.stop_daemon(f"slurmd-{node}")
    for node in nodes:
        cluster.start_daemon(f"slurmd-{node}")
    for node in nodes:
        poll(f"slurmd of {node} registered again",
             lambda n=node: slurmd_start(cluster, n) not in ("", before[n]), 30)


def start_job(cluster: Cluster, name: str) -> tuple[str, Path, list[str],
                                                    dict[str, tuple[int, float]]]:
    for folder in (f"ckpt-{name}", f"ckpt-{name}-r1"):
        shutil.rmtree(cluster.work / folder, ignore_errors=True)
    job_id = cluster.submit(script(name), name=f"{name}.sh")
    out = cluster.work / f"{name}-{job_id}.out"
    poll("step 3", lambda: last_step(out) >= 3, 60)
    nodes = sorted({str(e["node"]) for e in cluster.events(job_id)
                    if e["event"] == "prolog.context" and e.get("attempt") == 0})
    assert len(nodes) == 2, nodes
    procs = poll("the supervisor and both watchers", lambda: processes(cluster, job_id, nodes),
                 20)
    return job_id, out, nodes, procs
