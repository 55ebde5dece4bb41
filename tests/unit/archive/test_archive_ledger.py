"""The goodput ledger of one job, from hand-built attempts and from real event records."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.archive import summarized
from wrapper.archive.ledger import Attempt, Checkpoint, account, from_summaries
from wrapper.job import events as ev


def test_a_clean_run_is_all_productive() -> None:
    ledger = account([Attempt(0, 100.0, 200.0, "success",
                              (Checkpoint(130, 10), Checkpoint(160, 20)))], now=999)
    assert ledger.wall_s == 100
    assert ledger.productive_s == 100
    assert ledger.lost_s == 0 and ledger.gap_s == 0 and ledger.failures == 0
    assert ledger.ettr == 1.0
    assert ledger.checkpoint_interval_s == 30


def test_a_failure_loses_the_work_after_its_last_checkpoint_and_a_restart_gap() -> None:
    # attempt 0: checkpoints at 110 (step 10) and 120 (step 20), crashes at 125.
    # attempt 1 starts at 140, resumes from step 20; at 1 step/s its first checkpoint at
    # step 30 (t=160) means it was back at work at 150; it succeeds at 200.
    ledger = account([
        Attempt(0, 100.0, 125.0, "node_failure", (Checkpoint(110, 10), Checkpoint(120, 20))),
        Attempt(1, 140.0, 200.0, "success", (Checkpoint(160, 30), Checkpoint(170, 40)),
                resumed_step=20),
    ], now=999)
    first, second = ledger.attempts
    assert first.productive_s == 20 and first.lost_s == 5
    assert second.first_progress == 150 and second.gap_before_s == 25
    assert second.productive_s == 50
    assert ledger.wall_s == 100
    assert ledger.ettr == pytest.approx(0.70)
    assert ledger.lost_by_class == {"node_failure": 5}
    assert ledger.gaps_by_class == {"node_failure": [25]}


def test_start_up_and_the_resumed_checkpoint_are_not_work() -> None:
    # 1 step/s. Attempt 0 starts at 100 and imports for 10 s: step 10 at 120, step 20 at
    # 130; it is killed at 135. Attempt 1 starts at 140; its supervisor reports step 20
    # (the checkpoint it resumed from) at 141, before any work; it loads for 9 s, so its
    # step 30 comes at 160.
    ledger = account([
        Attempt(0, 100.0, 135.0, "killed", (Checkpoint(120, 10), Checkpoint(130, 20))),
        Attempt(1, 140.0, 180.0, "success",
                (Checkpoint(141, 20), Checkpoint(160, 30), Checkpoint(170, 40)),
                resumed_step=20),
    ], now=999)
    first, second = ledger.attempts
    assert first.startup_s == 10 and first.productive_s == 20 and first.lost_s == 5
    assert second.first_progress == 150 and second.gap_before_s == 15
    assert second.checkpoints == 2
    assert ledger.ettr == pytest.approx(50 / 80)


def test_a_failure_before_any_checkpoint_loses_the_whole_attempt() -> None:
    ledger = account([Attempt(0, 0.0, 50.0, "user_error"),
                      Attempt(1, 60.0, 100.0, "success")], now=999)
    assert ledger.attempts[0].lost_s == 50
    assert ledger.attempts[1].gap_before_s == 10
    assert ledger.ettr == pytest.approx(0.4)


def test_the_running_attempt_counts_up_to_now() -> None:
    ledger = account([Attempt(0, 0.0, 10.0, "hang", (Checkpoint(5, 5),)),
                      Attempt(1, 20.0, None, None, (Checkpoint(30, 15),), resumed_step=5)],
                     now=40)
    assert ledger.wall_s == 40
    assert ledger.attempts[1].kind == "running"
    assert ledger.attempts[1].ended_at == 40
    assert ledger.failures == 1


def test_skewed_clocks_never_give_negative_buckets() -> None:
    # attempt 1 claims to start before attempt 0 ended; a checkpoint lies outside its attempt
    ledger = account([Attempt(0, 100.0, 150.0, "hang", (Checkpoint(170, 3),)),
                      Attempt(1, 120.0, 200.0, "success", (Checkpoint(90, 1),),
                              resumed_step=3)], now=999)
    for entry in ledger.attempts:
        assert min(entry.productive_s, entry.lost_s, entry.gap_before_s, entry.startup_s) >= 0
    assert 0 <= ledger.ettr <= 1


def test_from_real_events_through_the_status_summaries() -> None:
    root = {"source": "root", "node": "n1"}
    events = [
        {"ts": 100, "event": "prolog.context", "attempt": 0, "context": {"nodes": ["n1"]},
         **root},
        {"ts": 110, "event": "checkpoint", "attempt": 0, "step": 10, "path": "/c/10",
         "source": "user"},
        {"ts": 120, "event": "checkpoint", "attempt": 0, "step": 20, "path": "/c/20",
         "source": "user"},
        {"ts": 125, "event": "attempt.end", "attempt": 0, "kind": "gpu_fault",
         "decision": "requeue", **root},
        {"ts": 140, "event": "prolog.context", "attempt": 1, "context": {"nodes": ["n2"]},
         **root},
        {"ts": 160, "event": "checkpoint", "attempt": 1, "step": 30, "path": "/c/30",
         "source": "user"},
        {"ts": 200, "event": "attempt.end", "attempt": 1, "kind": "success",
         "decision": "done", **root},
    ]
    ledger = account(from_summaries(summarized(events)), now=999)
    assert [a.kind for a in ledger.attempts] == ["gpu_fault", "success"]
    assert ledger.attempts[1].first_progress == 150  # resumed at step 20, 1 step/s
    assert ledger.lost_s == 5 and ledger.gap_s == 25
    assert ledger.ettr == pytest.approx(0.70)
    # and the same from the manifest's dict form
    dicts = [s.as_dict() for s in summarized(events)]
    assert account(from_summaries(dicts), now=999).ettr == pytest.approx(0.70)


def test_the_checkpoint_root_resumed_from_counts_when_the_supervisor_never_said_it() -> None:
    """The supervisor was killed after step 10's checkpoint; the job went on to save step 20
    at ts 120. Root's resume.chosen (its own lookup, at the next prolog) names step 20 and
    its mtime: the work up to it is kept, not lost. A user's resume.chosen counts for
    nothing, nor does a checkpoint time outside the attempt."""
    root = {"source": "root", "node": "n1"}
    events = [
        {"ts": 100, "event": "prolog.context", "attempt": 0, "context": {}, **root},
        {"ts": 110, "event": "checkpoint", "attempt": 0, "step": 10, "path": "/c/10",
         "source": "user"},
        {"ts": 125, "event": "attempt.end", "attempt": 0, "kind": "killed",
         "decision": "requeue", **root},
        {"ts": 140, "event": "prolog.context", "attempt": 1, "context": {}, **root},
        {"ts": 141, "event": "resume.chosen", "attempt": 1, "path": "/c/20", "step": 20,
         "mtime": 120.0, **root},
        {"ts": 200, "event": "attempt.end", "attempt": 1, "kind": "success",
         "decision": "done", **root},
    ]
    first = summarized(events)[0]
    assert first.latest_step == 20 and first.checkpoint_list[-1]["ts"] == 120.0
    ledger = account(from_summaries(summarized(events)), now=999)
    assert ledger.attempts[0].productive_s == 20 and ledger.attempts[0].lost_s == 5
    forged = [{**e, "source": "user"} if e["event"] == "resume.chosen" else e
              for e in events]
    assert account(from_summaries(summarized(forged)), now=999).attempts[0].lost_s == 15
    outside = [{**e, "mtime": 130.0} if e["event"] == "resume.chosen" else e for e in events]
    assert summarized(outside)[0].latest_step == 10


def test_garbage_in_a_summary_is_skipped_not_fatal() -> None:
    attempts = from_summaries([{"attempt": "x"}, {"attempt": 0, "started_at": "nan"},
                               {"attempt": 1, "started_at": 5, "status": "ended",
                                "ended_at": 9, "checkpoint_list": [{"ts": None}, "junk"],
                                "outcome": "hang"}])
    assert [a.number for a in attempts] == [1]
    assert account(attempts, now=10).lost_s == 4


_times = st.floats(min_value=0, max_value=1e6, allow_nan=False)


@st.composite
def _attempts(draw: st.DrawFn) -> list[Attempt]:
    count = draw(st.integers(1, 6))
    out = []
    for number in range(count):
        start = draw(_times)
        end = draw(st.none() | _times) if number == count - 1 else draw(_times)
        points = tuple(Checkpoint(draw(_times), draw(st.none() | st.integers(0, 10**6)))
                       for _ in range(draw(st.integers(0, 4))))
        kind = draw(st.sampled_from(["success", "hang", "node_failure", None]))
        out.append(Attempt(number, start, end, kind, points,
                           resumed_step=draw(st.none() | st.integers(0, 10**6))))
    return out


@settings(max_examples=300, deadline=None)
@given(_attempts(), _times)
def test_properties_of_any_ledger(attempts: list[Attempt], now: float) -> None:
    ledger = account(attempts, now=now)
    assert 0 <= ledger.ettr <= 1
    assert 0 <= ledger.lost_s <= ledger.wall_s + 1e-6
    assert 0 <= ledger.productive_s <= ledger.wall_s + 1e-6
    for entry in ledger.attempts:
        assert entry.started_at <= entry.first_progress <= entry.ended_at
        assert min(entry.productive_s, entry.lost_s, entry.gap_before_s, entry.startup_s) >= 0
    # the buckets partition the wall time
    total = ledger.productive_s + ledger.lost_s + ledger.gap_s + ledger.startup_s
    assert math.isclose(total, ledger.wall_s, rel_tol=1e-9, abs_tol=1e-6)
    assert sum(ledger.lost_by_class.values()) <= ledger.lost_s + 1e-6


def test_made_up_times_in_the_users_events_never_break_the_summary() -> None:
    events = [
        {"ts": 100, "event": "prolog.context", "attempt": 0, "source": "root",
         "context": {"nodes": ["n1"]}},
        {"ts": "soon", "event": "checkpoint", "attempt": 0, "step": "many", "source": "user"},
        {"ts": float("nan"), "event": "checkpoint", "attempt": 0, "step": 3, "source": "user"},
        {"ts": float("inf"), "event": "checkpoint", "attempt": 0, "step": 4, "source": "user"},
        {"ts": 150, "event": "attempt.end", "attempt": 0, "kind": "hang", "source": "root"},
    ]
    ledger = account(from_summaries(summarized(events)), now=999)
    assert [a.kind for a in ledger.attempts] == ["hang"]
    assert 0 <= ledger.ettr <= 1 and ledger.wall_s == 50


def test_a_users_early_claim_does_not_move_roots_start() -> None:
    events = [
        {"ts": 1, "event": "checkpoint", "attempt": 0, "step": 1, "source": "user"},
        {"ts": 100, "event": "prolog.context", "attempt": 0, "source": "root",
         "context": {"nodes": ["n1"]}},
        {"ts": 150, "event": "attempt.end", "attempt": 0, "kind": "success", "source": "root"},
    ]
    [summary] = summarized(events)
    assert summary.started_at == 100
    assert account(from_summaries([summary]), now=999).wall_s == 50


def test_absurd_steps_in_the_users_events_are_ignored() -> None:
    events = [
        {"ts": 100, "event": "prolog.context", "attempt": 0, "source": "root"},
        {"ts": 110, "event": "checkpoint", "attempt": 0, "step": float("inf"),
         "source": "user"},
        {"ts": 120, "event": "checkpoint", "attempt": 0, "step": 1e400, "source": "user"},
        {"ts": 150, "event": "attempt.end", "attempt": 0, "kind": "hang", "source": "root"},
    ]
    [summary] = summarized(events)
    assert summary.checkpoints == 2 and summary.latest_step is None


def test_the_manifest_merges_events_with_made_up_times() -> None:
    from wrapper.archive.manifest import merge_events

    merged = merge_events([{"ts": 5, "event": "a", "attempt": 0},
                           {"ts": "soon", "event": "b", "attempt": 0},
                           {"ts": float("nan"), "event": "c", "attempt": 0},
                           {"ts": 1e999, "event": "d", "attempt": 0}])
    last = merged[-1]
    assert isinstance(last, ev.Unknown) and last.name == "a" and len(merged) == 4


IN_PLACE = [  # one Slurm attempt, 1 step/s, jobwrap run restarting its command twice
    {"ts": 100, "event": "prolog.context", "attempt": 0, "context": {"nodes": ["n1", "n2"]},
     "source": "root", "node": "n1"},
    {"ts": 110, "event": "checkpoint", "attempt": 0, "step": 10, "source": "user"},
    {"ts": 120, "event": "checkpoint", "attempt": 0, "step": 20, "source": "user"},
    # killed at 125 (5 s of work lost), relaunched at 126, back at step 20 at 130
    {"ts": 126, "event": "run.restarted", "attempt": 0, "restart": 1, "kind_ended": "killed",
     "ended_at": 125, "source": "user", "node": "n1"},
    {"ts": 140, "event": "checkpoint", "attempt": 0, "step": 30, "source": "user"},
    # a hang ended at 160 (20 s lost), relaunched at 161, back at step 30 at 165
    {"ts": 161, "event": "run.restarted", "attempt": 0, "restart": 2, "kind_ended": "hang",
     "ended_at": 160, "source": "user", "node": "n1"},
    {"ts": 175, "event": "checkpoint", "attempt": 0, "step": 40, "source": "user"},
    {"ts": 180, "event": "attempt.end", "attempt": 0, "kind": "success", "decision": "done",
     "source": "root", "node": "n1"},
]


def test_restarts_inside_the_allocation_cut_the_attempt_into_parts() -> None:
    """jobwrap run's restarts are failures like a requeue: the work after the last
    checkpoint is lost and the relaunch is a gap (the ledger once counted it all as
    productive: ETTR 0.71-0.73 against 0.46 from the job's step lines)."""
    ledger = account(from_summaries(summarized(IN_PLACE)), now=999)
    parts = [(a.number, a.restart, a.kind, a.in_place) for a in ledger.attempts]
    assert parts == [(0, 0, "killed", True), (0, 1, "hang", True), (0, 2, "success", False)]
    assert [a.lost_s for a in ledger.attempts] == [5, 20, 0]
    assert [a.gap_before_s for a in ledger.attempts] == [0, 5, 5]  # 125->130, 160->165
    assert ledger.productive_s == 20 + 10 + 15 and ledger.wall_s == 80
    assert ledger.ettr == pytest.approx(45 / 80)
    # jobwrap run's classes, kept apart from root's in the per-class sums
    assert ledger.failures == 2
    assert ledger.lost_by_class == {"in_place:killed": 5, "in_place:hang": 20}
    assert ledger.gaps_by_class == {"in_place:killed": [5], "in_place:hang": [5]}


def test_what_jobwrap_run_says_stays_its_word() -> None:
    """The class of a restart in place is the job's user's word: only the classes jobwrap
    run restarts on, and none of it reaches the AdminComment or the cluster's counts."""
    from wrapper.archive.ledger import ledger_brief, ledger_from_brief
    from wrapper.goodput.report import JobLedger, build
    from wrapper.goodput.sacct import comment

    forged = [dict(e, kind_ended="success") if e["event"] == "run.restarted" else e
              for e in IN_PLACE]
    ledger = account(from_summaries(summarized(forged)), now=999)
    assert [a.kind for a in ledger.attempts] == ["unknown", "unknown", "success"]
    real = account(from_summaries(summarized(IN_PLACE)), now=999)
    assert comment(real, {0: "done"}).startswith("jobwrap: a0=success/done ettr=0.56")
    back = ledger_from_brief(ledger_brief(real))
    assert [(a.restart, a.in_place) for a in back.attempts] == [(0, True), (1, True),
                                                                 (2, False)]
    report = build([JobLedger("1", "u", back)])
    assert (report.attempts, report.failures) == (1, 0)
    assert report.run_s == pytest.approx(80 - 2)  # the two relaunches: between parts


def test_an_index_row_from_before_restarts_in_place_still_reads() -> None:
    from wrapper.archive.ledger import ledger_brief, ledger_from_brief

    brief = ledger_brief(account(from_summaries(summarized(IN_PLACE[:3])), now=130))
    brief["attempts"] = [row[:8] for row in brief["attempts"]]
    [attempt] = ledger_from_brief(brief).attempts
    assert (attempt.number, attempt.restart, attempt.in_place) == (0, 0, False)


def test_slow_nodes_travel_from_roots_record_through_the_index_row() -> None:
    """pulse.speed (root's) names the slow nodes with their scores; they reach the brief
    the index keeps, and a row from before slow nodes (10 fields) still reads."""
    from wrapper.archive.ledger import ledger_brief, ledger_from_brief

    events = [*IN_PLACE[:3], {"ts": 125, "event": "pulse.speed", "attempt": 0, "node": "n1",
                              "scores": {"n1": 1.0, "n2": 0.61}, "named": ["n2"],
                              "window_s": 60.0, "source": "root"}]
    forged = [*IN_PLACE[:3], {**events[-1], "source": "user"}]
    assert [a.slow for a in account(from_summaries(summarized(forged)), now=130).attempts] \
        == [{}]
    brief = ledger_brief(account(from_summaries(summarized(events)), now=130))
    assert [a.slow for a in ledger_from_brief(brief).attempts] == [{"n2": 0.61}]
    brief["attempts"] = [row[:10] for row in brief["attempts"]]
    assert [a.slow for a in ledger_from_brief(brief).attempts] == [{}]


def test_a_flood_of_claimed_restarts_is_bounded() -> None:
    flood = [*IN_PLACE[:3], *({"ts": 120 + i / 1000, "event": "run.restarted", "attempt": 0,
                               "restart": i, "kind_ended": "killed", "source": "user",
                               "node": "n1"} for i in range(1, 5000)), IN_PLACE[-1]]
    ledger = account(from_summaries(summarized(flood)), now=999)
    assert len(ledger.attempts) <= 101
    assert 0 <= ledger.ettr <= 1


def test_a_restart_claimed_in_the_future_or_before_any_checkpoint() -> None:
    """A run.restarted dated after now is no boundary (the running attempt's wall would
    run to it); a restart in attempt 0 before any checkpoint starts again from step 0."""
    import time

    running = [e for e in IN_PLACE if e["event"] != "attempt.end"]
    future = [*running, {**IN_PLACE[3], "ts": time.time() + 86400, "restart": 3}]
    now = 190
    assert len(account(from_summaries(summarized(future)), now=now).attempts) == 3
    early = [IN_PLACE[0], {**IN_PLACE[3], "ts": 106, "ended_at": 105}, *IN_PLACE[1:3],
             IN_PLACE[-1]]
    first, second = account(from_summaries(summarized(early)), now=999).attempts
    assert (first.kind, first.productive_s, first.lost_s) == ("killed", 0, 5)
    assert second.first_progress == 106  # from step 0 again: back at work at once
