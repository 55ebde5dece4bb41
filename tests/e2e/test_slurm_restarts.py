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

import time
from pathlib import Path

import pytest

from jobwrap_dev.sandbox.cluster import Cluster
from tests.support import poll
from tests.support.restarts import (
    EXPECTED,
    STEPS,
    alive,
    last_step,
    processes,
    restart_slurmd,
    start_job,
    write_payload,
)
from wrapper.config import SlurmConfig
from wrapper.errors import SlurmError
from wrapper.runner import Runner
from wrapper.slurm.commands import CliBackend
from wrapper.supervisor.launch import SlurmLook


@pytest.fixture(scope="module")
def payload(cluster: Cluster) -> str:
    return write_payload(cluster)


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
        for e in cluster.events(job_id)), 15)


def ends_right(cluster: Cluster, job_id: str, out: Path, nodes: list[str],
               procs: dict[str, tuple[int, float]]) -> None:
    info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED", "CANCELLED"}, timeout=60)
    output = out.read_text()
    assert info["JobState"] == "COMPLETED", output
    assert info["Restarts"] == "0", output  # never requeued
    assert output.count(f"done sum {EXPECTED}") == 2, output  # both ranks, no step lost
    for node in nodes:
        assert f"attempt 0: a new step on {node}" in output, output
    events = cluster.events(job_id)
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
    look = SlurmLook(backend, job_id, cluster.job_state(job_id), 0,
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
    gpus = next(e for e in cluster.events(job_id) if e["event"] == "prolog.context"
                and e["node"] == second)["context"]["gpus"]
    try:
        cluster.set_gpu_faults(second, {g: {"xid_events": (79,)} for g in gpus})
        info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED", "CANCELLED"},
                                timeout=75)
        output = out.read_text()
        assert info["JobState"] == "COMPLETED", output
        assert output.count(f"done sum {EXPECTED}") == 2, output
        events = cluster.events(job_id)
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

