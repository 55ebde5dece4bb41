"""The one judge of an attempt's end (``wrapper.restart.judge``), and the two paths that
call it: the first node's epilog and ``jobwrap run``."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.epilog import EpilogCase
from wrapper.config import Config, PathsConfig
from wrapper.hooks.epilog import decide_attempt
from wrapper.hooks.services import Services
from wrapper.job import events as ev
from wrapper.restart import judge as judge_mod
from wrapper.restart import runloop
from wrapper.restart.classify import Evidence
from wrapper.restart.judge import Facts, Judgement, Remote, judge
from wrapper.slurm.context import JobContext
from wrapper.slurm.fake import FakeSlurm
from wrapper.slurm.records import SlurmJob
from wrapper.submit.directives import parse_args

KILLED = Evidence(exit_code=137, output_tail="srun: error: n1: task 0: Killed\n")
OK = Evidence(exit_code=0)


def facts(evidence: Evidence = KILLED, **over: object) -> Facts:
    base: dict[str, object] = {"evidence": evidence, "attempt": 0, "max_restarts": 3,
                               "node": "n1", "nodes": 2}
    return Facts(**{**base, **over})  # type: ignore[arg-type]


def test_a_node_slurm_lost_outweighs_this_nodes_class_and_is_excluded_not_this_one() -> None:
    got = judge(facts(remote=Remote(lost={"n2": "DOWN*"})))
    assert got.verdict.kind == "node_failure" and "n2: DOWN*" in got.verdict.detail
    assert got.decision.action == "requeue" and got.decision.exclude_nodes == ["n2"]
    # Slurm's NODE_FAIL here too: still the lost node excluded, never the healthy first
    got = judge(facts(Evidence(slurm_state="NODE_FAIL"), remote=Remote(lost={"n2": "DOWN*"})))
    assert (got.verdict.kind, got.decision.exclude_nodes) == ("node_failure", ["n2"])


def test_a_fault_elsewhere_is_hardware_unless_the_work_really_succeeded() -> None:
    fault = Remote(faults={"n2": "jobwrap: xid gpu0"})
    got = judge(facts(remote=fault))
    assert (got.verdict.kind, got.decision.exclude_nodes) == ("hardware", ["n2"])
    signalled = SlurmJob.of({"ExitCode": "0:15"})
    assert judge(facts(OK, remote=fault, job=signalled)).verdict.kind == "hardware"
    clean = SlurmJob.of({"ExitCode": "0:0"})
    assert judge(facts(OK, remote=fault, job=clean)).verdict.kind == "success"
    assert judge(facts(remote=fault, nodes=1)).verdict.kind != "hardware"  # one node: its own


def test_what_jobwrap_did_to_a_run_is_its_class() -> None:
    assert judge(facts(OK, ended_by="hang")).verdict.kind == "hang"
    got = judge(facts(OK, ended_by="jobwrap: xid gpu1"))
    assert got.verdict.kind == "user_error" and "jobwrap: xid gpu1" in got.verdict.detail
    assert judge(facts(OK)).decision.action == "done"


def test_a_stopped_run_stops_only_the_jobs_own_failures() -> None:
    stopped = ev.RunStopped(attempt=0, kind_ended="killed", reason="brakes")
    got = judge(facts(run_stopped=stopped))
    assert got.decision.action == "stop" and "jobwrap run restarted it" in got.decision.reason
    got = judge(facts(run_stopped=stopped, remote=Remote(faults={"n2": "jobwrap: xid"})))
    assert got.decision.action == "requeue"  # a fault that is not the job's: requeued


def test_a_requeue_slurm_made_is_recorded_never_made_again() -> None:
    job = SlurmJob.of({"JobState": "PENDING", "Restarts": "1", "ExitCode": "0:0"})
    got = judge(facts(job=job))
    assert got.external is not None and got.external.restarts == 1
    assert got.decision.action == "requeue" and "without jobwrap" in got.decision.reason
    assert judge(facts(job=SlurmJob.of({"Restarts": "0"}))).external is None


def test_a_resume_that_failed_at_once_falls_back_past_the_suspect() -> None:
    bad, older = "/c/step_9", "/c/step_8"
    got = judge(facts(Evidence(exit_code=1, output_tail="RuntimeError: nan\n"),
                      resumed_from=bad, older_valid=older, checkpoint_path=bad))
    assert got.fallback == (bad, older) and older in got.decision.reason


@pytest.fixture
def judged(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Facts]]:
    """Every call of the one judge, from whichever path."""
    seen: list[Facts] = []

    def spy(given: Facts) -> Judgement:
        seen.append(given)
        return judge(given)

    monkeypatch.setattr(judge_mod, "judge", spy)
    monkeypatch.setattr(runloop, "judge", spy)
    yield seen


def test_the_epilog_and_jobwrap_run_ask_the_same_judge(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, epilog_case: EpilogCase,
        judged: list[Facts]) -> None:
    ctx, cfg, state, record, slurm, failed = epilog_case(tmp_path / "e", "user_error",
                                                         "first", True)
    decide_attempt(ctx, cfg, state, record, slurm, gpu_check_failed=failed,
                   services=Services(cfg, spawn=lambda argv: None))
    assert [f.evidence.exit_code for f in judged] == [1]
    saved = {s: signal.getsignal(s) for s in runloop.FORWARDED}
    try:
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
        run_cfg = Config(paths=PathsConfig(state_dir=str(tmp_path / "state")))
        assert runloop.run(["sh", "-c", "exit 3"], parse_args(["--max-restarts=0"]), run_cfg,
                           say=lambda text: None) == 3
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    assert [f.evidence.exit_code for f in judged] == [1, 3]


def test_a_slurmd_restart_is_not_blamed_where_a_down_node_explains_the_node_fail() -> None:
    """NODE_FAIL on a 3-node job: n2 is DOWN (the loss), n3's slurmd was only restarted
    under the job (a rolling restart). n2 alone is lost; with no down node, n3 is."""
    import os
    from datetime import datetime

    from wrapper.restart.remote import lost_nodes
    from wrapper.slurm.context import JobContext
    from wrapper.slurm.fake import FakeSlurm

    began = 1_800_000_000.0
    restarted = {"State": "IDLE", "SlurmdStartTime": datetime.fromtimestamp(
        began + 60).isoformat(timespec="seconds")}
    ctx = JobContext(hook="epilog", job_id="9", user="u", uid=os.getuid(), gid=os.getgid(),
                     node="n1", nodes=["n1", "n2", "n3"], attempt=0)
    fail = {"JobId": "9", "JobState": "NODE_FAIL", "Restarts": "0"}
    slurm = FakeSlurm(nodes={"n2": {"State": "DOWN*", "Reason": "Not responding"},
                             "n3": restarted})
    assert list(lost_nodes(slurm, ctx, fail, since=began)) == ["n2"]
    slurm = FakeSlurm(nodes={"n2": {"State": "IDLE"}, "n3": restarted})
    assert list(lost_nodes(slurm, ctx, fail, since=began)) == ["n3"]



def _two_node_epilog(job: dict[str, str], n2: dict[str, str],
                     accounting: list[tuple[str, float | None]] | None = None
                     ) -> tuple[JobContext, FakeSlurm]:
    """The first node's epilog of a 2-node job 9 (attempt 0), n2 as Slurm shows it, and
    Slurm's accounting of the job (None: the site keeps none)."""
    import os

    ctx = JobContext(hook="epilog", job_id="9", user="u", uid=os.getuid(), gid=os.getgid(),
                     node="n1", nodes=["n1", "n2"], attempt=0)
    slurm = FakeSlurm(jobs={"9": job}, nodes={"n2": n2},
                      accounting={"9": accounting} if accounting is not None else {})
    return ctx, slurm


def _no_sleep(seconds: float) -> None:
    pass


def test_a_boot_time_past_the_start_is_no_loss_unless_slurm_ended_the_attempt() -> None:
    """n2's BootTime (slurmctld's clock less n2's uptime) reads 5 s after the attempt's
    start (the first node's prolog record, another clock): a node power saving resumed
    just before the job, or clocks apart. The job requeued itself (Lightning): nothing
    was lost. Only Slurm's own NODE_FAIL (its record, or its accounting) makes the boot a
    loss; the times then only name the node."""
    from datetime import datetime

    from wrapper.restart.remote import lost_nodes

    began = 1_800_000_000.0
    booted = {"State": "IDLE", "BootTime": datetime.fromtimestamp(began + 5).isoformat()}
    requeued = {"JobId": "9", "JobState": "PENDING", "Restarts": "1"}
    ctx, slurm = _two_node_epilog(requeued, booted, [("REQUEUED", began + 60)])
    assert lost_nodes(slurm, ctx, requeued, since=began, sleep=_no_sleep) == {}
    ctx, slurm = _two_node_epilog(requeued, booted)  # no accounting: no loss
    assert lost_nodes(slurm, ctx, requeued, since=began, sleep=_no_sleep) == {}
    ctx, slurm = _two_node_epilog(requeued, booted, [("NODE_FAIL", began + 60)])
    assert list(lost_nodes(slurm, ctx, requeued, since=began, sleep=_no_sleep)) == ["n2"]
    fail = {"JobId": "9", "JobState": "NODE_FAIL", "Restarts": "0"}
    ctx, slurm = _two_node_epilog(fail, booted)
    got = lost_nodes(slurm, ctx, fail, since=began)
    assert "booted again" in got["n2"] and not slurm.did("ended_attempts")


def test_asking_slurms_accounting_never_runs_past_the_epilogs_deadline() -> None:
    """sacct is asked up to four times over about 3 s while the requeued attempt's record
    reaches slurmdbd: with 2 s of the epilog's budget left, the waits and asks stop
    before its deadline, and each ask has at most the time left."""
    from datetime import datetime

    from wrapper.restart.remote import lost_nodes

    began = 1_800_000_000.0
    restarted = {"State": "IDLE",
                 "SlurmdStartTime": datetime.fromtimestamp(began + 60).isoformat()}
    requeued = {"JobId": "9", "JobState": "PENDING", "Restarts": "1"}
    ctx, slurm = _two_node_epilog(requeued, restarted, [])  # not in slurmdbd yet
    now = [100.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    deadline = now[0] + 2.0
    got = lost_nodes(slurm, ctx, requeued, since=began, sleep=sleep, deadline=deadline,
                     clock=lambda: now[0])
    assert got == {} and now[0] <= deadline
    assert 1 <= len(slurm.timeouts) < 4, slurm.timeouts
    assert all(t is not None and t <= 2.0 for t in slurm.timeouts), slurm.timeouts
    ctx, slurm = _two_node_epilog(requeued, restarted, [])
    assert lost_nodes(slurm, ctx, requeued, since=began, sleep=_no_sleep) == {}
    assert slurm.timeouts == [None] * 4  # no deadline given: asked as before
