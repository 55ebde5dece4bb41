"""No attempt runs unchecked: a node where Slurm skipped jobwrap's prolog for an attempt.

slurmd before 23.02 skips the Prolog of a job requeued back onto a node within seconds
(its credential cache still holds the job id). The task-prolog then ends the attempt's
tasks there (tests/unit/hooks/test_hooks.py); these tests cover what root does after: the first
node's decision classes the attempt ``unchecked`` and requeues it away from that node
(tests/unit/restart/test_epilog_matrix.py), another node's epilog excludes itself from the
requeue, and nothing the job prints can pass for Slurm's skip.
"""

from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.support.epilog import JOB, EpilogCase
from wrapper.config import ChecksConfig
from wrapper.hooks import epilog as epilog_mod
from wrapper.hooks.epilog import decide_attempt
from wrapper.hooks.services import Services
from wrapper.job import events as ev
from wrapper.job.store import JobStore
from wrapper.restart.classify import Classification
from wrapper.restart.policy import Decision, PastAttempt, decide
from wrapper.slurm.context import JobContext


@pytest.mark.parametrize("action", ["requeue", "run"])
def test_another_nodes_epilog_keeps_the_next_attempt_off_it(tmp_path: Path,
                                                           epilog_case: EpilogCase,
                                                           action: str) -> None:
    _ctx, cfg, state, _record, slurm, _ = epilog_case(tmp_path, "user_error", "first", True)
    cfg = cfg.replace(checks=ChecksConfig(epilog=False),
                      hooks=cfg.hooks.replace(unchecked_attempt=action))
    store = JobStore(state)
    store.record(ev.PrologContext(node="n2", hook="prolog", attempt=0))
    store.record(ev.EpilogContext(node="n2", hook="epilog", attempt=0))
    # Attempt 1: the prolog ran on n1 (the first node), Slurm skipped it on n2.
    store.record(ev.PrologContext(node="n1", hook="prolog", attempt=1))
    ctx = JobContext(hook="epilog", job_id=JOB, user="u", uid=os.getuid(), gid=os.getgid(),
                     node="n2", nodes=["n1", "n2"], gpus=[0], attempt=1, exit_code=1,
                     exit_signal=0)
    spawned: list[Sequence[str]] = []
    services = Services(cfg, slurm_factory=lambda: slurm, spawn=spawned.append,
                        gpu_confirm=lambda node, gpus: [])
    assert epilog_mod.run(ctx, cfg, io.StringIO(), {}, services=services) == 0
    [marked] = [e for e in store.root_events() if isinstance(e, ev.AttemptUnchecked)]
    assert (marked.node, marked.attempt, marked.excluded) == ("n2", 1, action == "requeue")
    assert "jobwrap's prolog did not run on n2 for attempt 1" in marked.reason
    releases = [list(argv)[list(argv).index("release"):] for argv in spawned
                if "release" in argv]
    assert releases == ([["release", JOB, "--exclude", "n2"]] if action == "requeue" else [])
    assert not slurm.did("requeue")  # the requeue is the first node's decision


def test_a_node_whose_prolog_ran_marks_nothing(tmp_path: Path,
                                               epilog_case: EpilogCase) -> None:
    _ctx, cfg, state, _record, slurm, _ = epilog_case(tmp_path, "user_error", "first", True)
    cfg = cfg.replace(checks=ChecksConfig(epilog=False))
    store = JobStore(state)
    store.record(ev.PrologContext(node="n2", hook="prolog", attempt=0))
    ctx = JobContext(hook="epilog", job_id=JOB, user="u", uid=os.getuid(), gid=os.getgid(),
                     node="n2", nodes=["n1", "n2"], gpus=[0], attempt=0, exit_code=1,
                     exit_signal=0)
    spawned: list[Sequence[str]] = []
    epilog_mod.run(ctx, cfg, io.StringIO(), {},
                   services=Services(cfg, slurm_factory=lambda: slurm, spawn=spawned.append))
    assert not [e for e in store.root_events() if isinstance(e, ev.AttemptUnchecked)]
    assert spawned == []


def test_the_jobs_own_words_cannot_pass_for_a_skipped_prolog(
        tmp_path: Path, epilog_case: EpilogCase) -> None:
    """The gate's line printed by the job, and a user event claiming the skip, with root's
    prolog record present: the job's own failure, counted against it."""
    ctx, cfg, state, record, slurm, _ = epilog_case(tmp_path, "user_error", "first", True)
    Path(record.stdout).write_text(
        f"jobwrap: job {JOB} did not start on n1: jobwrap's prolog did not run on n1 for "
        "attempt 0 (slurmd before 23.02 skips it ...)\n")
    state.append("attempt.unchecked", as_user=True, node="n1", attempt=0, reason="forged")
    decision, _ = decide_attempt(ctx, cfg, state, record, slurm, gpu_check_failed=False,
                                 services=Services(cfg, spawn=lambda argv: None))
    end = JobStore(state).last_end()
    assert isinstance(end, ev.AttemptEnd)
    assert end.kind == "user_error"
    assert decision.exclude_nodes == []


def test_with_unchecked_attempt_run_the_attempt_is_judged_as_it_ran(
        tmp_path: Path, epilog_case: EpilogCase) -> None:
    ctx, cfg, state, record, slurm, _ = epilog_case(tmp_path, "unchecked", "first", True)
    cfg = cfg.replace(hooks=cfg.hooks.replace(unchecked_attempt="run"))
    Path(record.stdout).write_text("ValueError: bad input\n")
    decide_attempt(ctx, cfg, state, record, slurm, gpu_check_failed=False,
                   services=Services(cfg, spawn=lambda argv: None))
    end = JobStore(state).last_end()
    assert isinstance(end, ev.AttemptEnd)
    assert end.kind == "user_error"


def _decide(kind: str, signature: str, attempt: int, max_restarts: int,
            history: list[tuple[str, str]]) -> Decision:
    """The policy for ``attempt`` ending in ``kind``, after ``history``'s (kind, signature)."""
    return decide(Classification(kind, signature, signature), attempt=attempt,
                  max_restarts=max_restarts, no_requeue=False,
                  history=[PastAttempt(i, k, sig, None) for i, (k, sig) in enumerate(history)],
                  checkpoint_step=None, checkpoint_path=None, node="n1", no_progress_limit=0)


def test_an_attempt_slurm_ran_unchecked_spends_none_of_the_jobs_restarts() -> None:
    # attempts 0 (killed) and 1 (unchecked): attempt 2 is the job's 1st restart of 1
    at_limit = _decide("killed", "killed", 2, 1, [("killed", "killed"),
                                                   ("unchecked", "unchecked")])
    assert at_limit.action == "stop" and "restart limit reached (1 of" in at_limit.reason
    room = _decide("killed", "killed", 1, 1, [("unchecked", "unchecked")])
    assert room.action == "requeue" and "restart 1 of at most 1" in room.reason


def test_slurm_skipping_the_prolog_again_and_again_ends() -> None:
    again = _decide("unchecked", "unchecked", 2, 2, [("user_error", "exit:1"),
                                                     ("unchecked", "unchecked")])
    assert again.action == "requeue" and again.exclude_nodes == ["n1"]
    assert "its code did not run" in again.reason
    stop = _decide("unchecked", "unchecked", 2, 1, [("unchecked", "unchecked")] * 2)
    assert stop.action == "stop" and "skipped jobwrap's prolog 3 times" in stop.reason


def test_the_same_error_on_both_sides_of_a_skip_is_still_the_same_error() -> None:
    decision = _decide("user_error", "ValueError: x", 2, 5, [("user_error", "ValueError: x"),
                                                             ("unchecked", "unchecked")])
    assert decision.action == "stop" and "the same error ended attempts 0 and 2" in \
        decision.reason


SKIPPED_ON_N2 = (f"jobwrap: job {JOB} did not start on n2: jobwrap's prolog did not run on n2 "
                 "for attempt 1 (slurmd before 23.02 skips it ...), so nothing checked ...\n")


def _skip_on_the_second_node(tmp_path: Path, epilog_case: EpilogCase, output: str, *,
                             n2_prolog: bool = False, before_banner: str = "",
                             slurm_state: str = "CANCELLED", exit_code: int = 137
                             ) -> tuple[Decision, ev.AttemptEnd]:
    """Attempt 1 of a job on n1 and n2 after a failure at the same checkpoint (the
    no-progress brake would stop it), its rank on n1 ended by the supervisor as a hang
    while it waited for the rank n2's task-prolog ended; as the first node's epilog
    finds it where state is node-local (no record of n2 here)."""
    ctx, cfg, state, record, slurm, _ = epilog_case(tmp_path, "hang", "one_failure_before",
                                                    True)
    ctx = dataclasses.replace(ctx, nodes=["n1", "n2"], exit_code=exit_code)
    if n2_prolog:  # root's record of it, visible here (a state folder the nodes share)
        JobStore(state).record(ev.PrologContext(node="n2", hook="prolog", attempt=1))
    Path(record.stdout).write_text(before_banner + "jobwrap: attempt 1 after user_error\n"
                                   + output)
    slurm.jobs[JOB]["JobState"] = slurm_state  # the supervisor's scancel
    decision, _ = decide_attempt(ctx, cfg, state, record, slurm, gpu_check_failed=False,
                                 services=Services(cfg, spawn=lambda argv: None))
    end = JobStore(state).last_end()
    assert isinstance(end, ev.AttemptEnd)
    return decision, end


@pytest.mark.parametrize(("slurm_state", "exit_code"), [
    ("CANCELLED", 137),
    # 22.05: the epilog of a job the supervisor cancelled gets exit 0, and Slurm's record
    # may already read COMPLETED (CI lost the DDP job this way once more)
    ("COMPLETED", 0), ("", 0)])
def test_a_skip_on_another_node_requeues_the_job_away_from_it(
        tmp_path: Path, epilog_case: EpilogCase, slurm_state: str, exit_code: int) -> None:
    """The first node sees no other node's prolog record: the task-prolog's line in the
    job's output is what tells it. Classed ``unchecked``: requeued past the no-progress
    brake, with n2 (not this node) excluded."""
    decision, end = _skip_on_the_second_node(tmp_path, epilog_case, SKIPPED_ON_N2,
                                             slurm_state=slurm_state, exit_code=exit_code)
    assert (end.kind, end.decision) == ("unchecked", "requeue"), end
    assert "jobwrap's prolog did not run on n2 for attempt 1" in end.detail
    assert decision.exclude_nodes == ["n2"]


@pytest.mark.parametrize("line", [
    SKIPPED_ON_N2.replace("on n2", "on n3"),  # a node outside the job's allocation
    SKIPPED_ON_N2.replace("attempt 1", "attempt 0"),  # another attempt's line
    SKIPPED_ON_N2.replace("on n2:", "on n1:").replace("run on n2", "run on n1"),  # this node
    SKIPPED_ON_N2.replace("run on n2", "run on n1"),  # two nodes in one line
    "  " + SKIPPED_ON_N2,  # not at a line's start
    # another job's line: array tasks sharing one output file (--open-mode=append)
    SKIPPED_ON_N2.replace(f"job {JOB} ", f"job {int(JOB) + 1} "),
])
def test_a_skip_claim_that_does_not_fit_the_attempt_is_not_believed(
        tmp_path: Path, epilog_case: EpilogCase, line: str) -> None:
    decision, end = _skip_on_the_second_node(tmp_path, epilog_case, line)
    assert (end.kind, end.decision) == ("hang", "stop"), end
    assert decision.exclude_nodes == []


def test_root_record_of_the_nodes_prolog_outweighs_the_claim(
        tmp_path: Path, epilog_case: EpilogCase) -> None:
    """Where the nodes share root's state folder, root's record of n2's prolog for the
    attempt says the line is not Slurm's skip."""
    decision, end = _skip_on_the_second_node(tmp_path, epilog_case, SKIPPED_ON_N2,
                                             n2_prolog=True)
    assert (end.kind, end.decision) == ("hang", "stop"), end
    assert decision.exclude_nodes == []


def test_the_task_prologs_line_is_the_one_the_epilog_reads_back() -> None:
    from wrapper.hooks.task_prolog import unchecked_message

    ctx = JobContext(hook="task_prolog", job_id=JOB, user="u", uid=os.getuid(),
                     gid=os.getgid(), node="gpu-a07.rack3", nodes=["gpu-a01", "gpu-a07.rack3"],
                     gpus=[0], attempt=12)
    line = unchecked_message(ctx, ends=True)
    assert ev.claimed_unchecked(line, JOB, 12) == ["gpu-a07.rack3"]
    for label in ("3: ", " 3: ", "P1  3: "):  # srun --label: padded, heterogeneous jobs
        assert ev.claimed_unchecked(f"{label}{line}", JOB, 12) == ["gpu-a07.rack3"], label
    assert ev.claimed_unchecked(line, JOB, 1) == []
    assert ev.claimed_unchecked(unchecked_message(ctx, ends=False), JOB, 12) == []  # it ran
    # array tasks sharing one output file (--open-mode=append): another job's line, even
    # for a node and attempt number this job has too, is not this job's
    assert ev.claimed_unchecked(line, str(int(JOB) + 1), 12) == []
    assert ev.claimed_unchecked(line.replace(f"job {JOB} ", f"job {JOB}0 "), JOB, 12) == []


def test_roots_own_facts_outweigh_a_skip_another_node_reports(
        tmp_path: Path, epilog_case: EpilogCase) -> None:
    """The line cannot hide what root found here: a GPU fault root's check confirmed stays
    ``hardware`` (the node's fault counted, the node excluded)."""
    ctx, cfg, state, record, slurm, failed = epilog_case(tmp_path, "hardware",
                                                         "one_failure_before", True)
    ctx = dataclasses.replace(ctx, nodes=["n1", "n2"])
    Path(record.stdout).write_text("jobwrap: attempt 1 after user_error\n" + SKIPPED_ON_N2)
    decision, _ = decide_attempt(ctx, cfg, state, record, slurm, gpu_check_failed=failed,
                                 services=Services(cfg, spawn=lambda argv: None))
    end = JobStore(state).last_end()
    assert isinstance(end, ev.AttemptEnd) and end.kind == "hardware", end
    assert decision.exclude_nodes == ["n1"]


def test_a_skip_line_before_this_attempts_banner_is_an_older_ones(
        tmp_path: Path, epilog_case: EpilogCase) -> None:
    """With --open-mode=append the output holds earlier jobs' words: only this attempt's
    (after its banner) count."""
    decision, end = _skip_on_the_second_node(tmp_path, epilog_case, "",
                                             before_banner=SKIPPED_ON_N2)
    assert (end.kind, end.decision) == ("hang", "stop") and decision.exclude_nodes == []


def test_a_skip_only_another_node_reported_spends_a_restart() -> None:
    """Root's record of a skip spends none of the job's restarts; the job's word from
    another node spends one, as any restart does (the no-progress brake it passes, the
    job could pass itself by writing a checkpoint)."""
    from wrapper.restart.classify import CLAIMED_SKIP

    def claimed(attempt: int, max_restarts: int, history: list[tuple[str, str]]) -> Decision:
        return decide(Classification("unchecked", "x", CLAIMED_SKIP), attempt=attempt,
                      max_restarts=max_restarts, no_requeue=False,
                      history=[PastAttempt(i, k, sig, 3) for i, (k, sig) in
                               enumerate(history)],
                      checkpoint_step=3, checkpoint_path="/c/3", node="", no_progress_limit=2)

    assert claimed(1, 1, [("killed", "killed")]).action == "stop"  # its one restart spent
    room = claimed(1, 2, [("killed", "killed")])
    assert room.action == "requeue" and "restart 1 of at most 2" not in room.reason
    assert "2 of at most 2" in room.reason
    # after the job's one restart and a skip on root's record (free), a claimed skip
    # finds the limit reached; a claimed skip in the history spent a restart as well
    assert claimed(2, 1, [("killed", "killed"), ("unchecked", "unchecked")]).action == "stop"
    assert _decide("killed", "killed", 2, 1, [("unchecked", "unchecked"),
                                              ("unchecked", CLAIMED_SKIP)]).action == "stop"
    assert _decide("killed", "killed", 2, 1, [("unchecked", "unchecked"),
                                              ("unchecked", "unchecked")]).action == "requeue"
