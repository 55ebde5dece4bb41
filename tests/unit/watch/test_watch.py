"""The node watcher: its tick loop with a fake clock, its fault reading through the real
fake probe and checks, and the first node's view of faults on other nodes."""

from __future__ import annotations

from pathlib import Path

from jobwrap_dev.sandbox import gpus
from wrapper import config
from wrapper.config import SlurmConfig
from wrapper.job import events as ev
from wrapper.restart.classify import Classification, Evidence
from wrapper.restart.judge import Facts, overridden
from wrapper.restart.remote import faults_elsewhere, gather
from wrapper.slurm import SlurmBackend
from wrapper.slurm.commands import CliBackend
from wrapper.slurm.context import JobContext
from wrapper.slurm.records import SlurmJob
from wrapper.watch.feed import Fault, Watcher
from wrapper.watch.process import read_faults


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(faults: list[list[Fault]], states: list[str | None], *, superseded: bool = False,
         unreachable: float = 30.0) -> tuple[Watcher, Clock, list[list[Fault]], list[int]]:
    clock = Clock()
    acted: list[list[Fault]] = []
    reads = [0]

    def read() -> list[Fault]:
        reads[0] += 1
        return faults.pop(0) if faults else []

    watcher = Watcher(job_id="5", node="n2", attempt=0, interval=2.0, slurm_interval=10.0,
                      slurm_unreachable=unreachable, read_faults=read,
                      job_state=lambda: states.pop(0) if states else "RUNNING",
                      superseded=lambda: superseded, on_fault=acted.append, clock=clock)
    return watcher, clock, acted, reads


XID = Fault("xid", 0, "jobwrap: xid gpu0(GPU-1): Xid 79")


def test_a_fault_is_acted_on_at_the_first_reading_after_it_and_only_once() -> None:
    watcher, clock, acted, reads = make([[], [], [XID], [XID]], [])
    for _ in range(3):
        watcher.tick()
        clock.now += 1.0  # ticks between two readings read nothing
    assert reads[0] == 2 and not acted
    for _ in range(4):
        watcher.tick()
        clock.now += 1.0
    assert acted == [[XID]]  # within one interval of the fault appearing
    assert reads[0] == 3  # once it acted it reads no more
    assert not watcher.finished


def test_it_ends_when_the_job_no_longer_runs_or_a_later_attempt_does() -> None:
    watcher, clock, _, _ = make([], ["RUNNING", "COMPLETED"])
    for _ in range(25):
        watcher.tick()
        clock.now += 1.0
    assert watcher.finished == "job COMPLETED"
    watcher, clock, _, _ = make([], [], superseded=True)
    clock.now += 10.0
    watcher.tick()
    assert watcher.finished == "a later attempt runs"


def test_an_unreachable_slurm_is_waited_out_then_given_up_on() -> None:
    watcher, clock, _, _ = make([], [None, None, None, None], unreachable=25.0)
    clock.now += 10.0
    for _ in range(3):
        watcher.tick()
        assert not watcher.finished
        clock.now += 10.0
    watcher.tick()
    assert watcher.finished == "slurm unreachable"


def test_run_stops_when_the_epilog_asks() -> None:
    watcher, _, _, _ = make([], [])
    asked = iter([False, False, True])
    assert watcher.run(sleep=lambda s: None, stopped=lambda: next(asked)) == \
        "stopped by the epilog"


def test_read_faults_names_the_xid_of_an_allocated_gpu_only(tmp_path: Path) -> None:
    inventory = tmp_path / "n2.toml"
    (tmp_path / "c.toml").write_text(
        f'[gpu]\nbackend = "fake"\nfake_inventory = "{tmp_path}/{{node}}.toml"\n')
    cfg = config.load(str(tmp_path / "c.toml"))
    gpus.write(inventory, "n2", 4)
    assert read_faults(cfg, "n2", [0, 1]) == []
    gpus.write(inventory, "n2", 4, {2: {"xid_events": (79,)}})
    assert read_faults(cfg, "n2", [0, 1]) == []  # not the job's GPU
    gpus.write(inventory, "n2", 4, {1: {"xid_events": (79,), "memory_used_mib": 5000}})
    found = read_faults(cfg, "n2", [0, 1])
    assert [(f.check, f.gpu) for f in found] == [("xid", 1)]  # memory in use: expected mid-job
    assert found[0].reason.startswith("jobwrap: xid gpu1(") and "79" in found[0].reason
    assert len(found[0].reason) <= 120
    inventory.write_text("not toml [")  # the probe's problem: no fault, keep watching
    assert read_faults(cfg, "n2", [0, 1]) == []


def ctx(node: str = "n1") -> JobContext:
    return JobContext(job_id="5", user="u", uid=1000, gid=1000, node=node,
                      nodes=["n1", "n2"], hook="epilog")


def no_slurm() -> SlurmBackend:
    """Slurm's real CLI backend, with an scontrol that does not exist: nothing answers, so
    the first node decides from root's events alone."""
    return CliBackend(SlurmConfig(scontrol_command="/nonexistent/scontrol"))


def test_root_events_of_another_node_make_the_attempt_hardware_and_exclude_it() -> None:
    events = [ev.WatchFault(node="n2", attempt=0, reason=XID.reason),
              ev.WatchFault(node="n2", attempt=1, reason="old"),
              ev.WatchFault(node="n9", attempt=0, reason="not the job's")]
    assert faults_elsewhere(no_slurm(), ["n1", "n2"], "n1", 0, events) == {"n2": XID.reason}
    killed = Classification("user_error", "exit -1 (signal 9)", "exit:-1:9:")

    def with_remote_faults(verdict: Classification, events: list[ev.Event],
                           slurm_job: dict[str, str]) -> tuple[Classification, dict[str, str]]:
        # the epilog's two halves: root's and Slurm's facts gathered, then the judge's
        others = gather(no_slurm(), ctx(), events, slurm_job, verdict.kind)
        return overridden(verdict, Facts(evidence=Evidence(), attempt=0, max_restarts=3,
                                         remote=others, nodes=2, job=SlurmJob.of(slurm_job)))

    verdict, remote = with_remote_faults(killed, events, {})
    assert remote == {"n2": XID.reason}
    assert verdict.kind == "hardware" and "n2: jobwrap: xid gpu0" in verdict.detail
    ok = Classification("success", "exit 0")  # the epilog's view of a job a watcher ended
    assert with_remote_faults(ok, events, {"ExitCode": "0:15"})[0].kind == "hardware"
    # really succeeded: another node drained after it (its post-job check) changes nothing
    assert with_remote_faults(ok, events, {"ExitCode": "0:0"}) == (ok, {})
    assert with_remote_faults(killed, [], {}) == (killed, {})


def test_stop_ends_only_the_watcher_its_pid_file_names(tmp_path: Path) -> None:
    import subprocess
    import sys

    import psutil

    from wrapper.job.state import JobState
    from wrapper.watch.files import pid_file
    from wrapper.watch.process import stop

    state = JobState(tmp_path, "77")
    state.prepare(None, None)
    code = "import time; time.sleep(60)"
    other = subprocess.Popen([sys.executable, "-c", code, "something-else"])
    watcher = subprocess.Popen([sys.executable, "-c", code, "wrapper.watch", "77"])
    try:
        # a pid file naming another process (pid reuse, or a forged one) ends nothing
        state.write_json(pid_file("n1"), {"pid": other.pid,
                                          "started": psutil.Process(other.pid).create_time()})
        assert stop(state, "n1") is False and other.poll() is None
        state.write_json(pid_file("n1"), {"pid": watcher.pid, "started": 1.0})  # not its start
        assert stop(state, "n1") is False and watcher.poll() is None
        state.write_json(pid_file("n1"), {
            "pid": watcher.pid, "started": psutil.Process(watcher.pid).create_time()})
        assert stop(state, "n1") is True
        watcher.wait(timeout=5)  # ended (psutil reaped it: its status is not ours to see)
        assert other.poll() is None  # the other process lives on
        assert stop(state, "n2") is False  # no watcher on that node
    finally:
        for proc in (other, watcher):
            proc.kill()
            proc.wait()
