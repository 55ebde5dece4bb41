"""Slurm restarted under a running job: the job, its supervisor and its node watchers go on.

A site restarts slurmd on every node (``systemctl restart slurmd``: SIGTERM, wait, start)
for a reconfiguration or an upgrade, and slurmctld too, while jobs run. A real 2-node job
(the toy loop as two ranks in lockstep, one srun task per node) has its Slurm restarted
mid-run; it must end with the sum of an uninterrupted run, not requeued, followed all
along by the very supervisor and watchers the prolog started, and its epilog must decide
``success``/``done``. A GPU fault after the restart is still caught by the watcher the
prolog started before it. docs/recovery.md, "Slurm restarted under a running job".
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path

import psutil
import pytest

import wrapper.sandbox
from tests.support import poll
from wrapper.config import SlurmConfig
from wrapper.errors import SlurmError
from wrapper.job.state import JobState
from wrapper.runner import Runner
from wrapper.sandbox.cluster import Cluster
from wrapper.slurm.commands import CliBackend
from wrapper.supervisor.launch import SlurmLook
from wrapper.watch.process import pid_file

STEPS = 40
EXPECTED = STEPS * (STEPS + 1) // 2
PAYLOAD = Path(wrapper.sandbox.__file__).parent / "toy_train.py"


@pytest.fixture(scope="module")
def payload(cluster: Cluster) -> str:
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
    state = JobState(cluster.state_dir, job_id)
    pids = {f"supervisor {e['pid']}": int(e["pid"]) for e in state.events()
            if e["event"] == "supervisor.start" and e.get("attempt") == 0}
    for node in nodes:
        record = state.read_json(pid_file(node))
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
    nodes = sorted({str(e["node"]) for e in JobState(cluster.state_dir, job_id).events()
                    if e["event"] == "prolog.context" and e.get("attempt") == 0})
    assert len(nodes) == 2, nodes
    procs = poll("the supervisor and both watchers", lambda: processes(cluster, job_id, nodes),
                 20)
    return job_id, out, nodes, procs


def goes_on(cluster: Cluster, job_id: str, out: Path, nodes: list[str],
            procs: dict[str, tuple[int, float]], since: float) -> None:
    """After the restart the job makes progress, watched by the same processes, and the
    supervisor still records what it sees (a checkpoint noted after the restart)."""
    step = last_step(out)
    poll("three more steps", lambda: last_step(out) >= min(STEPS, step + 3), 30)
    assert all(alive(procs).values()), alive(procs)
    assert processes(cluster, job_id, nodes) == procs  # no new supervisor or watcher
    poll("a checkpoint seen by the supervisor after the restart", lambda: any(
        e["event"] == "checkpoint" and float(e["ts"]) > since
        for e in JobState(cluster.state_dir, job_id).events()), 15)


def ends_right(cluster: Cluster, job_id: str, out: Path, nodes: list[str],
               procs: dict[str, tuple[int, float]]) -> None:
    info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED", "CANCELLED"}, timeout=60)
    output = out.read_text()
    assert info["JobState"] == "COMPLETED", output
    assert info["Restarts"] == "0", output  # never requeued
    assert output.count(f"done sum {EXPECTED}") == 2, output  # both ranks, no step lost
    for node in nodes:
        assert f"attempt 0: a new step on {node}" in output, output
    events = JobState(cluster.state_dir, job_id).events()
    ends = [(e["attempt"], e["kind"], e["decision"]) for e in events
            if e["event"] == "attempt.end" and e["source"] == "root"]
    assert ends == [(0, "success", "done")], ends
    # one prolog per node (a restarted slurmd did not run it again), one supervisor and
    # watcher each, none started again
    kinds = [(e["event"], e.get("node")) for e in events if e["source"] == "root"]
    for node in nodes:
        assert kinds.count(("prolog.context", node)) == 1, kinds
        assert kinds.count(("watch.started", node)) == 1, kinds
    assert not [e for e in events if e["event"] == "supervisor.restarted"], events
    assert [e["pid"] for e in events if e["event"] == "supervisor.start"] == [
        procs[name][0] for name in procs if name.startswith("supervisor")]
    # the epilog found and stopped each node's watcher by its pid file; the supervisor
    # saw the end and left
    poll("the supervisor and watchers gone after the job",
         lambda: not any(alive(procs).values()), 15)


def test_slurmd_restarted_on_every_node_under_a_running_job(cluster: Cluster,
                                                             payload: str) -> None:
    job_id, out, nodes, procs = start_job(cluster, "slurmd-restart")
    since = time.time()
    restart_slurmd(cluster, nodes)
    assert cluster.job(job_id)["JobState"] == "RUNNING"
    goes_on(cluster, job_id, out, nodes, procs, since)
    ends_right(cluster, job_id, out, nodes, procs)


def test_slurmctld_restarted_under_a_running_job(cluster: Cluster, payload: str) -> None:
    job_id, out, nodes, procs = start_job(cluster, "ctld-restart")
    kept = ("JobId", "JobState", "NodeList", "StartTime", "Restarts", "BatchHost")
    before = {k: cluster.job(job_id).get(k) for k in kept}
    since = time.time()
    cluster.stop_daemon("slurmctld")
    step = last_step(out)  # without a controller the job trains on
    # What the supervisor and the watchers ask (at most once a minute, once in 10 min: a
    # short restart may fall between two asks, so it is asked here): the real squeue
    # against no slurmctld is no answer, never "the job is gone", and they keep watching.
    backend = CliBackend(SlurmConfig(command_timeout=3), Runner(cluster.env()))
    with pytest.raises(SlurmError):
        backend.job_state(job_id)
    look = SlurmLook(backend, job_id, JobState(cluster.state_dir, job_id), 0,
                     unreachable_after=600)
    assert look() == "RUNNING"
    poll("two steps while slurmctld is down", lambda: last_step(out) >= step + 2, 15)
    cluster.start_daemon("slurmctld")
    after = {k: cluster.job(job_id).get(k) for k in kept}
    assert after == before  # slurmctld recovered the job from its saved state
    goes_on(cluster, job_id, out, nodes, procs, since)
    ends_right(cluster, job_id, out, nodes, procs)


def test_a_gpu_fault_after_slurmd_restarts_is_still_caught(cluster: Cluster,
                                                           payload: str) -> None:
    job_id, out, nodes, procs = start_job(cluster, "restart-xid")
    first, second = nodes
    restart_slurmd(cluster, nodes)
    state = JobState(cluster.state_dir, job_id)
    gpus = next(e for e in state.events() if e["event"] == "prolog.context"
                and e["node"] == second)["context"]["gpus"]
    try:
        cluster.set_gpu_faults(second, {g: {"xid_events": (79,)} for g in gpus})
        info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED", "CANCELLED"},
                                timeout=75)
        output = out.read_text()
        assert info["JobState"] == "COMPLETED", output
        assert output.count(f"done sum {EXPECTED}") == 2, output
        events = state.events()
        # the watcher the prolog started before the restart is the one that acted
        faults = [e for e in events if e["event"] == "watch.fault"]
        assert [(e["attempt"], e["node"]) for e in faults] == [(0, second)], faults
        assert "xid" in str(faults[0]["reason"]), faults
        started = [e["pid"] for e in events if e["event"] == "watch.started"
                   and e["node"] == second and e["attempt"] == 0]
        assert started == [procs[f"watcher {second}"][0]], started
        ends = [(e["attempt"], e["kind"], e["decision"]) for e in events
                if e["event"] == "attempt.end" and e["source"] == "root"]
        assert ends == [(0, "hardware", "requeue"), (1, "success", "done")], ends
        attempt1 = {e["node"] for e in events if e["event"] == "prolog.context"
                    and e.get("attempt") == 1}
        assert second not in attempt1 and first in attempt1, attempt1
        drained = Runner(cluster.env()).run(["sinfo", "-h", "-N", "-n", second, "-o",
                                             "%T|%E"], timeout=10).stdout.strip()
        assert drained.startswith("drain") and "|jobwrap: xid gpu" in drained, drained
    finally:
        cluster.set_gpu_faults(second)
        Runner(cluster.env()).run(["scontrol", "update", f"NodeName={second}",
                                   "State=RESUME"], timeout=20, check=False)
        cluster.wait_idle(timeout=60)
