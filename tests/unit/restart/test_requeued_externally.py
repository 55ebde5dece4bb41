"""A job that requeued itself (Lightning's auto-requeue), or was requeued by an admin or by
Slurm, is never requeued a second time by jobwrap: the first node's epilog reads Slurm's
``Restarts``, records ``requeue.external`` and only releases the job.

Driven through the epilog's real decision path with the in-process ``FakeSlurm``, which
records every requeue asked of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.support.epilog import JOB, MAX_RESTARTS, EpilogCase
from wrapper.hooks.epilog import decide_attempt
from wrapper.hooks.services import Services
from wrapper.job import events as ev
from wrapper.job.store import JobStore
from wrapper.restart.classify import Classification
from wrapper.restart.policy import Decision
from wrapper.restart.requeued import ended_attempt, hold_back, requeued_without_jobwrap
from wrapper.slurm.context import JobContext
from wrapper.slurm.records import SlurmJob


def _decide(epilog_case: EpilogCase, tmp_path: Path, kind: str, restarts: str | None
            ) -> tuple[Decision, list[ev.Event], list[Sequence[str]], list[tuple[str, ...]], str]:
    ctx, cfg, state, record, slurm, gpu_failed = epilog_case(tmp_path, kind, "first", True)
    if restarts is not None:
        slurm.jobs[JOB]["Restarts"] = restarts
    spawned: list[Sequence[str]] = []
    decision, _ = decide_attempt(ctx, cfg, state, record, slurm, gpu_check_failed=gpu_failed,
                                 services=Services(cfg, spawn=spawned.append,
                                                   gpu_confirm=lambda node, gpus: []))
    return (decision, JobStore(state).root_events(), spawned, slurm.did("requeue"),
            Path(record.stdout).read_text())


# The attempt ends as Lightning's requeue leaves it (Slurm killed the batch: signalled),
# or as anything else would: whatever the class, Slurm already requeued the job.
@pytest.mark.parametrize("kind", ["walltime", "cancelled", "success", "user_error", "hang"])
def test_a_job_requeued_without_jobwrap_is_not_requeued_twice(tmp_path: Path,
                                                              epilog_case: EpilogCase,
                                                              kind: str) -> None:
    decision, events, spawned, requeues, told = _decide(epilog_case, tmp_path, kind, "1")
    assert requeues == []  # Slurm is not asked a second time
    external = [e for e in events if isinstance(e, ev.RequeuedWithoutJobwrap)]
    assert [(e.attempt, e.restarts, e.kind) for e in external] == [(0, 1, kind)]
    assert all(e.from_root for e in external)
    ends = [e for e in events if isinstance(e, ev.AttemptEnd)]
    assert [(e.decision, e.kind) for e in ends] == [("requeue", kind)]
    assert "requeued without jobwrap" in ends[0].reason
    assert decision.action == "requeue"
    assert len(spawned) == 1 and list(spawned[0])[-2:] == ["release", JOB]  # eligible now
    assert f"jobwrap: attempt 0 ended: {kind}" in told and "does not requeue it again" in told


def test_jobwrap_requeues_once_when_slurm_has_not_counted_a_requeue(
        tmp_path: Path, epilog_case: EpilogCase) -> None:
    decision, events, spawned, requeues, _ = _decide(epilog_case, tmp_path, "walltime", "0")
    assert decision.action == "requeue" and requeues == [("requeue", JOB)]
    assert len(spawned) == 1
    assert not [e for e in events if isinstance(e, ev.RequeuedWithoutJobwrap)]


def test_an_unreadable_restart_count_is_no_requeue_by_anyone_else(
        tmp_path: Path, epilog_case: EpilogCase) -> None:
    for n, text in enumerate((None, "", "x", "99999999999")):
        _, events, _, requeues, _ = _decide(epilog_case, tmp_path / str(n), "walltime", text)
        assert requeues == [("requeue", JOB)], text
        assert not [e for e in events if isinstance(e, ev.RequeuedWithoutJobwrap)]


def test_a_faulty_node_stays_excluded_when_the_job_requeued_itself() -> None:
    job = SlurmJob.of({"JobId": JOB, "JobState": "PENDING", "Restarts": "3"})
    assert requeued_without_jobwrap(2, job) and not requeued_without_jobwrap(3, job)
    decision, event = hold_back(Decision("requeue", "hardware", exclude_nodes=["n2"]),
                                Classification("hardware", "xid", "gpu_fault"),
                                attempt=2, node="n1", job=job)
    assert decision.exclude_nodes == ["n2"] and decision.action == "requeue"
    assert event is not None and (event.restarts, event.slurm_state) == (3, "PENDING")
    same, none = hold_back(Decision("stop", "cancelled"),
                           Classification("cancelled", "scancel", "cancelled"),
                           attempt=3, node="n1", job=job)
    assert none is None and same == Decision("stop", "cancelled")
    # the supervisor's own save-and-requeue before the time limit is told as such
    told, _ = hold_back(Decision("stop", "success"), Classification("success", "exit 0", ""),
                        attempt=2, node="n1", job=job, saved="/ck/step_110")
    assert told.action == "requeue" and told.reason.startswith(
        "requeued before its time limit by jobwrap's supervisor once the checkpoint it asked "
        "for was saved (/ck/step_110")


@pytest.mark.parametrize("kind", ["walltime", "success", "node_failure"])
def test_a_job_its_own_requeue_put_past_the_restart_limit_is_not_released(
        tmp_path: Path, epilog_case: EpilogCase, kind: str) -> None:
    """Attempt 3 of a job with --max-restarts=3 requeued itself (Lightning's auto-requeue;
    Slurm's Restarts is 4): the requeue is recorded, never asked again, and the job is
    not made eligible at once; the decision is a stop that says the limit is past."""
    ctx, cfg, state, record, slurm, _ = epilog_case(tmp_path, kind, "at_limit", True)
    assert ctx.attempt == MAX_RESTARTS
    slurm.jobs[JOB]["Restarts"] = str(MAX_RESTARTS + 1)
    spawned: list[Sequence[str]] = []
    decision, _ = decide_attempt(ctx, cfg, state, record, slurm, gpu_check_failed=False,
                                 services=Services(cfg, spawn=spawned.append,
                                                   gpu_confirm=lambda node, gpus: []))
    assert spawned == [] and slurm.did("requeue") == []  # no release, no second requeue
    assert decision.action == "stop" and "past its restart limit" in decision.reason
    events = JobStore(state).root_events()
    [external] = [e for e in events if isinstance(e, ev.RequeuedWithoutJobwrap)]
    assert (external.attempt, external.restarts) == (MAX_RESTARTS, MAX_RESTARTS + 1)
    [end] = [e for e in events if isinstance(e, ev.AttemptEnd)]
    assert end.decision == "stop"
    told = Path(record.stdout).read_text()
    assert "does not release it" in told


def test_a_requeue_within_the_restart_limit_is_released_and_skips_do_not_count() -> None:
    job = SlurmJob.of({"JobId": JOB, "JobState": "PENDING", "Restarts": "3"})
    walltime = Classification("walltime", "time limit", "walltime")
    within, event = hold_back(Decision("requeue", "walltime"), walltime, attempt=2,
                              node="n1", job=job, max_restarts=3)
    assert within.action == "requeue" and event is not None
    past, event = hold_back(Decision("requeue", "walltime"), walltime, attempt=2,
                            node="n1", job=job, max_restarts=2)
    assert past.action == "stop" and "restart 3 of at most --max-restarts=2" in past.reason
    assert event is not None and event.reason == past.reason
    # one attempt before was Slurm's without jobwrap's prolog: 2 restarts spent, not 3
    spared, _ = hold_back(Decision("requeue", "walltime"), walltime, attempt=2, node="n1",
                          job=job, max_restarts=2, spent=1)
    assert spared.action == "requeue"
    # the supervisor's save-and-requeue past the limit is not released either
    saved, _ = hold_back(Decision("stop", "success"), walltime, attempt=2, node="n1",
                         job=job, saved="/ck/step_9", max_restarts=2)
    assert saved.action == "stop"


def test_the_ended_attempt_is_the_one_root_started_here(tmp_path: Path,
                                                        epilog_case: EpilogCase) -> None:
    """Slurm counts a requeue made while the job ran at once: the epilog's environment
    says attempt 1 for the attempt 0 that ran; root's prolog record of the node says 0."""
    ctx, _cfg, state, _record, _slurm, _ = epilog_case(tmp_path, "walltime", "first", True)
    store = JobStore(state)
    later = JobContext(**{**ctx.__dict__, "attempt": 1})
    assert ended_attempt(later, store).attempt == 0
    assert ended_attempt(ctx, store) == ctx
    store.record(ev.PrologContext(node="n2", hook="prolog", attempt=1))  # another node's
    assert ended_attempt(later, store).attempt == 0
    store.record(ev.PrologContext(node="n1", hook="prolog", attempt=1))
    assert ended_attempt(later, store) == later
    empty = JobStore(type(state)(tmp_path / "other", JOB))
    assert ended_attempt(later, empty) == later  # no prolog record here: Slurm's count


def test_a_skipped_prolog_is_no_requeue(tmp_path: Path, epilog_case: EpilogCase) -> None:
    """slurmd skipped the Prolog of attempt 1 on n1 (the job back on it within seconds; its
    credential cache held the job id): root's only prolog record here is attempt 0's, whose
    epilog here already ran. The epilog is about attempt 1, Slurm's count, and the
    decision must not take the job's own requeue for one (CI, 22.05)."""
    ctx, _cfg, state, _record, _slurm, _ = epilog_case(tmp_path, "success", "first", True)
    store = JobStore(state)
    store.record(ev.EpilogContext(node="n1", hook="epilog", attempt=0))
    later = JobContext(**{**ctx.__dict__, "attempt": 1})
    assert ended_attempt(later, store) == later
    # a late end message of attempt 0 on a node whose epilog of it has not run yet
    store.record(ev.PrologContext(node="n2", hook="prolog", attempt=0))
    on_n2 = JobContext(**{**later.__dict__, "node": "n2"})
    assert ended_attempt(on_n2, store).attempt == 0


@pytest.mark.parametrize(("limit", "restarts", "kind"), [
    ("00:02:00", "1", "walltime"),  # requeued itself 20 s before its limit
    ("01:00:00", "1", "success"),  # an hour before: not for the limit
    ("00:02:00", "0", "success"),  # not requeued at all
    ("UNLIMITED", "1", "success"),
])
def test_a_job_that_requeued_itself_just_before_its_limit_ended_by_walltime(
        tmp_path: Path, epilog_case: EpilogCase, limit: str, restarts: str,
        kind: str) -> None:
    """jobwrap's supervisor (or Lightning's signal trap) saved and requeued the job before
    its time limit; the batch script then ended clean. Slurm's record (its Restarts, its
    time limit now) and the attempt's start are root's facts: the time limit ended it."""
    import time
    from dataclasses import replace

    ctx, cfg, state, record, slurm, _ = epilog_case(tmp_path, "success", "first", True)
    record = replace(record, start_time=time.time() - 100)
    slurm.jobs[JOB].update({"JobState": "COMPLETING", "Restarts": restarts,
                            "TimeLimit": limit})
    decide_attempt(ctx, cfg, state, record, slurm, gpu_check_failed=False,
                   services=Services(cfg, spawn=lambda argv: None,
                                     gpu_confirm=lambda node, gpus: []))
    ends = [e for e in JobStore(state).root_events() if isinstance(e, ev.AttemptEnd)]
    assert [e.kind for e in ends] == [kind]
    if kind == "walltime":
        assert "before its time limit" in ends[0].detail and ends[0].decision == "requeue"
