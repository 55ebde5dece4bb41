from __future__ import annotations

from tests.support.archive import run_attempt, summarized
from wrapper.archive.status import (
    ENDED,
    ENDING,
    RUNNING,
    AttemptSummary,
    job_state,
    render,
    summarize,
    timeline,
)
from wrapper.job import events as ev
from wrapper.job.state import JobState
from wrapper.job.store import JobStore


def timeline_of(job: JobState) -> list[AttemptSummary]:
    return timeline(JobStore(job))


def test_a_finished_job_tells_both_attempts_in_order(job: JobState) -> None:
    run_attempt(job, 0, ["n1", "n2"], kind="hardware", decision="requeue", checkpoints=(100,
                                                                                        200))
    job.append("gpu.fault", as_user=True, attempt=0, hook="supervisor", reason="xid 79 gpu1")
    run_attempt(job, 1, ["n1", "n3"], checkpoints=(300,))
    first, second = timeline_of(job)
    assert (first.attempt, first.status, first.nodes) == (0, ENDED, ["n1", "n2"])
    assert (first.checkpoints, first.latest_step) == (2, 200)
    assert (first.outcome, first.decision) == ("hardware", "requeue")
    assert first.health == [{"node": "n1", "phase": "prolog", "verdict": "pass", "detail": ""},
                            {"node": "n2", "phase": "prolog", "verdict": "pass", "detail": ""}]
    assert first.started_at is not None and first.ended_at is not None
    assert first.started_at <= first.ended_at
    assert (second.attempt, second.nodes, second.outcome, second.decision) == (
        1, ["n1", "n3"], "success", "done")
    text = render("42", [first, second])
    assert text.index("attempt 0") < text.index("attempt 1")
    assert "checkpoints  2 (latest step 200)" in text
    assert "decision     requeue: requeue reason" in text
    assert "finished: success (done)" in text.splitlines()[0]


def test_a_running_attempt_shows_running(job: JobState) -> None:
    run_attempt(job, 0, ["n1"], kind="walltime", decision="requeue")
    job.append("prolog.context", node="n1", attempt=1, context={"nodes": ["n1"]})
    job.append("checkpoint", as_user=True, attempt=1, hook="supervisor", path="/c/9", step=9)
    attempts = timeline_of(job)
    assert [a.status for a in attempts] == [ENDED, RUNNING]
    assert attempts[1].ended_at is None and attempts[1].latest_step == 9
    text = render("42", attempts, now=(attempts[1].started_at or 0) + 125)
    assert "-> running  (2m05s so far)" in text
    assert job_state(attempts) == "attempt 1 running"
    job.append("epilog.context", node="n1", attempt=1, context={})
    assert timeline_of(job)[1].status == ENDING


def test_the_users_events_cannot_forge_a_verdict(job: JobState) -> None:
    job.append("prolog.context", node="n1", attempt=0, context={"nodes": ["n1"]})
    job.append("attempt.end", as_user=True, attempt=0, kind="success", decision="done")
    (attempt,) = timeline_of(job)
    assert (attempt.status, attempt.outcome, attempt.decision) == (RUNNING, None, None)


def test_an_attempt_followed_by_another_is_over_even_without_its_verdict() -> None:
    attempts = summarized([
        {"ts": 1, "event": "prolog.context", "attempt": 0, "node": "n1", "source": "root"},
        {"ts": 5, "event": "prolog.context", "attempt": 1, "node": "n2", "source": "root"},
        {"ts": 2, "event": "hang", "attempt": 0, "idle_s": 600, "source": "user"},
    ])
    assert [(a.attempt, a.status) for a in attempts] == [(0, ENDED), (1, RUNNING)]
    assert attempts[0].ended_at == 5 and attempts[0].incidents == [
        "hang: no progress for 600 s"]


def test_summaries_round_trip_through_a_manifest() -> None:
    summary = AttemptSummary(2, ENDED, ["n1"], 1.0, 2.0, checkpoints=3, latest_step=30,
                             outcome="success", decision="done")
    assert AttemptSummary.from_dict({**summary.as_dict(), "files": {}}) == summary
    assert render("5", []) == "job 5: no attempt recorded\n"


def test_the_users_events_cannot_forge_a_failed_prolog() -> None:
    def facts(source: str) -> list[dict[str, object]]:
        return [
            {"ts": 1, "event": "prolog.context", "attempt": 0, "node": "n1",
             "source": "root"},
            {"ts": 2, "event": "prolog.unhealthy", "attempt": 0, "node": "n1", "reason": "x",
             "source": source},
            {"ts": 3, "event": "directives.invalid", "attempt": 0, "error": "x",
             "source": source},
        ]

    # the same facts recorded by root are told, so the user's are dropped for who wrote them
    assert summarized(facts("root"))[0].incidents == [
        "n1 failed its prolog health check: x", "bad #JOBWRAP directives: x"]
    assert summarized(facts("user"))[0].incidents == []


def test_user_events_annotate_root_attempts_and_never_create_one() -> None:
    events = [
        {"ts": 10.0, "event": "prolog.context", "attempt": 0, "node": "n1", "source": "root"},
        {"ts": 12.0, "event": "checkpoint", "attempt": 0, "path": "c1", "step": 1,
         "source": "user"},
        *({"ts": 11.0 + a, "event": "supervisor.start", "attempt": a, "source": "user"}
          for a in range(52, 120)),
    ]
    summaries = summarized(events)
    assert [s.attempt for s in summaries] == [0]
    assert summaries[0].latest_checkpoint == "c1" and summaries[0].started_at == 10.0


def test_a_users_malformed_events_neither_raise_nor_make_an_attempt() -> None:
    """Each field of the wrong type takes its class's default (ev.decode): no event of
    the user's makes summarize raise (a spare_used's "failed": 5 and an attempt of 1e999
    once did), and only the attempt root recorded is told."""
    user_side = {"source": "user"}
    events = [
        {"ts": 10, "event": "prolog.context", "attempt": 0, "node": "n1", "source": "root",
         "context": {"nodes": ["n1"]}},
        {"ts": "soon", "event": "checkpoint", "attempt": 0, "path": 5, "step": "x",
         "save_s": "slow", **user_side},
        {"ts": 12, "event": "run.spare_used", "attempt": 0, "failed": 5, "replaced_by": "n9",
         "reason": ["r"], "spares_left": "many", **user_side},
        {"ts": 13, "event": "run.started", "attempt": 0, "spare_nodes": "lots", **user_side},
        {"ts": 14, "event": "hang", "attempt": 0, "idle_s": {"s": 1}, **user_side},
        {"ts": 15, "event": "walltime.signal", "attempt": 0, "signal": 15, **user_side},
        {"ts": 16, "event": "checkpoint", "attempt": 1e999, "step": 9, **user_side},
        {"ts": 17, "event": "checkpoint", "attempt": "0", "step": 9, **user_side},
        {"ts": 18, "event": "checkpoint", "attempt": 7, "step": 70, **user_side},
        {"ts": 19, "event": "attempt.end", "attempt": 7, "kind": "success", **user_side},
        {"ts": 20, "event": "prolog.context", "attempt": 8, "context": "n1", **user_side},
    ]
    [only] = summarized(events)
    assert (only.attempt, only.status, only.nodes, only.started_at) == (0, RUNNING, ["n1"], 10)
    assert only.checkpoints == 1
    assert only.checkpoint_list == [{"path": None, "step": None, "ts": None}]
    assert (only.spares_held, only.spares_used) == (0, 0)
    assert only.incidents == ["moved onto spare : ; 0 spare left",
                              "hang: no progress for 0.0 s",
                              "walltime: sent a signal before the time limit"]
    assert render("42", [only], now=100).startswith("job 42: 1 attempt, attempt 0 running")
    # summarize itself, given each line decoded on its own, still tells attempt 0 alone
    assert [s.attempt for s in summarize(ev.decode(e) for e in events)] == [0]


def test_a_line_that_names_no_attempt_annotates_none() -> None:
    attempts = summarized([
        {"ts": 10, "event": "prolog.context", "attempt": 0, "node": "n1", "source": "root"},
        {"ts": 11, "event": "prolog.context", "node": "n2", "source": "root",
         "context": {"attempt": 1, "nodes": ["n2"]}},  # the context's attempt counts
        {"ts": 12, "event": "checkpoint", "path": "/c/1", "step": 1, "source": "user"},
        {"ts": 13, "event": "hang", "attempt": None, "idle_s": 5, "source": "user"},
    ])
    assert [(a.attempt, a.nodes, a.checkpoints, a.incidents) for a in attempts] == [
        (0, ["n1"], 0, []), (1, ["n2"], 0, [])]


def test_the_pulse_is_told_from_roots_events_only() -> None:
    def facts(source: str) -> list[dict[str, object]]:
        return [
            {"ts": 1, "event": "prolog.context", "attempt": 0, "node": "n1",
             "source": "root"},
            {"ts": 2, "event": "pulse.lost", "attempt": 0, "node": "n1", "lost": "n2",
             "silent_s": 4.52, "source": source},
            {"ts": 4, "event": "pulse.down", "attempt": 0, "node": "n1", "lost": "n2",
             "reason": "jobwrap: lost", "error": "", "source": source},
            {"ts": 5, "event": "pulse.fenced", "attempt": 0, "node": "n3", "silent_s": 4.6,
             "why": "no ack from the hub", "killed": 2, "source": source},
            {"ts": 6, "event": "pulse.hang", "attempt": 0, "node": "n1", "held_s": 15.0,
             "stuck": ["rank 1 (pid 9 on n3) at main (t.py:4)"], "why": "1 of 2 ranks wait",
             "source": source},
            {"ts": 7, "event": "pulse.slow", "attempt": 0, "node": "n1", "slow": "n3",
             "score": 0.62, "scores": {"n1": 1.0, "n3": 0.62}, "window_s": 60.0,
             "held_s": 30.0, "source": source},
            {"ts": 8, "event": "pulse.speed", "attempt": 0, "node": "n1",
             "scores": {"n1": 1.0, "n2": 0.97, "n3": 0.6}, "named": ["n3"],
             "window_s": 60.0, "source": source},
        ]

    assert summarized(facts("root"))[0].incidents == [
        "n2 lost: no heartbeat for 4.52 s", "n2 set DOWN in Slurm",
        "n3 fenced itself (no ack from the hub): 2 process(es) of the job killed",
        "hang: stuck 15 s (1 of 2 ranks wait); rank 1 (pid 9 on n3) at main (t.py:4)",
        "n3 named slow: its ranks at 0.62 of the job's typical rank's speed for 30 s"]
    told = summarized(facts("root"))
    assert (told[0].speed, told[0].slow) == ({"n1": 1.0, "n2": 0.97, "n3": 0.6}, ["n3"])
    assert "  speed        n3 0.60 SLOW, n2 0.97, n1 1.00  (1.00 = as fast as the typical " \
        "rank)" in render("7", told)
    by_user = summarized(facts("user"))[0]  # the user's words are no loss, no slow node
    assert (by_user.incidents, by_user.speed, by_user.slow) == ([], {}, [])
