"""Root's verdicts on a job's earlier attempts reach the nodes of its next attempt through
the job's archive, each node keeping its own state folder (wrapper/archive/carry.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.archive import config, record
from wrapper.archive import archive_attempt
from wrapper.archive.carry import earlier_verdicts
from wrapper.config import Config
from wrapper.job import events as ev
from wrapper.job.state import JobState
from wrapper.job.store import JobStore
from wrapper.osl.users import UserIds


def _node_state(shared: Path, node: str, user: UserIds) -> JobState:
    job = JobState(shared / node / "state", "42")
    job.prepare(user.uid, user.gid)
    return job


def _archived_on_a(shared: Path, user: UserIds, *events: ev.Event) -> tuple[Config, JobState]:
    """Attempt 0 of job 42 ran on node a, which recorded ``events`` (root's), and its
    epilog archived its part; the config and a's state."""
    cfg = config(shared)
    (shared / "work").mkdir(exist_ok=True)
    on_a = _node_state(shared, "a", user)
    for event in events:
        JobStore(on_a).record(event)
    archive_attempt(cfg, on_a, record(shared, user), attempt=0, node="a", script_text="",
                    extra={})
    return cfg, on_a


def test_the_next_attempts_first_node_learns_the_verdicts_made_on_another(
        shared: Path, user: UserIds) -> None:
    cfg = config(shared)
    (shared / "work").mkdir()
    on_a, on_b = _node_state(shared, "a", user), _node_state(shared, "b", user)
    a = JobStore(on_a)
    a.record(ev.PrologContext(node="a", hook="prolog", attempt=0, context={}))
    a.record(ev.CheckpointSuspect(attempt=0, node="a", path="/ck/step-20", reason="crashed"))
    a.record(ev.AttemptEnd(attempt=0, node="a", kind="user_error", decision="requeue",
                           reason="exit 1", signature="sig-1"))
    # the user's own file on a claims a verdict root never made
    on_a.append(ev.AttemptEnd.KIND, as_user=True, attempt=0, node="a", kind="success",
                decision="done")
    archive_attempt(cfg, on_a, record(shared, user), attempt=0, node="a", script_text="",
                    extra={})

    b = JobStore(on_b)
    assert b.history(before=1) == [] and b.suspects() == []  # b keeps only its own
    assert earlier_verdicts(cfg, b, job_id="42", user=user.name, attempt=1) == 2
    [end] = b.history(before=1)
    assert (end.kind, end.decision, end.signature, end.node) == \
        ("user_error", "requeue", "sig-1", "a")
    assert [s.path for s in b.suspects()] == ["/ck/step-20"]
    assert all(e.from_root for e in b.events() if isinstance(e, ev.AttemptEnd))
    # once: a second prolog of the attempt (or a node that made them) copies nothing
    assert earlier_verdicts(cfg, b, job_id="42", user=user.name, attempt=1) == 0
    assert earlier_verdicts(cfg, a, job_id="42", user=user.name, attempt=1) == 0
    # nothing of the attempt itself nor later ones, and none without an archive
    assert earlier_verdicts(cfg, b, job_id="42", user=user.name, attempt=0) == 0
    assert earlier_verdicts(config(shared, enabled=False), JobStore(
        _node_state(shared, "c", user)), job_id="42", user=user.name, attempt=1) == 0


def test_no_archive_yet_leaves_the_nodes_memory_as_it_is(shared: Path, user: UserIds) -> None:
    cfg = config(shared)
    b = JobStore(_node_state(shared, "b", user))
    assert earlier_verdicts(cfg, b, job_id="42", user=user.name, attempt=3) == 0
    assert b.history(before=3) == []


def test_a_spare_swap_is_known_to_the_next_batch_node_through_the_archive(
        shared: Path, user: UserIds, monkeypatch: pytest.MonkeyPatch) -> None:
    """jobwrap run's own word of how many nodes worked after a swap (its run.spare_used)
    is on the node it ran on; a requeued job's batch node is most often another."""
    from wrapper.restart.spares import working_before

    cfg = config(shared)  # its state_dir is this node's own (b): empty for the job
    (shared / "work").mkdir()
    on_a = _node_state(shared, "a", user)
    JobStore(on_a).record(ev.SpareUsed(attempt=0, node="a", failed=["n2"], working=2,
                                       replaced_by=["n3"], spares_left=0))
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # attempt 1's batch node: b
    monkeypatch.setenv("USER", user.name)
    assert working_before(cfg) is None  # not archived yet: nothing known here
    archive_attempt(cfg, on_a, record(shared, user), attempt=0, node="a", script_text="",
                    extra={})
    assert working_before(cfg) == 2
    assert working_before(config(shared, enabled=False)) is None


def test_the_ledger_takes_an_attempt_it_only_heard_of_from_the_archive(
        shared: Path, user: UserIds) -> None:
    """Carried verdicts make a partial attempt here (its end, no start, no checkpoint):
    the goodput ledger and the AdminComment take that attempt's whole story from the
    archive, never the partial one."""
    from wrapper.goodput.hook import attempt_records

    cfg, _on_a = _archived_on_a(
        shared, user, ev.PrologContext(node="a", hook="prolog", attempt=0, context={}),
        ev.AttemptEnd(attempt=0, node="a", kind="hardware", decision="requeue"))
    on_b = _node_state(shared, "b", user)
    b = JobStore(on_b)
    b.record(ev.PrologContext(node="b", hook="prolog", attempt=1, context={}))
    earlier_verdicts(cfg, b, job_id="42", user=user.name, attempt=1)
    got = attempt_records(on_b, cfg.paths.archive_root, user.name)
    [zero, one] = got
    assert (zero["attempt"], zero["outcome"], one["attempt"]) == (0, "hardware", 1)
    # the archive's whole attempt (where it ran, from its start), not the end alone
    assert zero["nodes"] == ["a"] and zero["started_at"] < zero["ended_at"], zero


def test_carry_reads_only_bounded_verdict_files_within_its_time(
        shared: Path, user: UserIds) -> None:
    """A part's events can hold megabytes the user wrote; the next attempt's prolog reads
    only each part's small verdict file: one past its bound is left out, and none is read
    once its share of the prolog's budget is spent."""
    import json

    from wrapper.archive.parts import VERDICTS, VERDICTS_MAX_BYTES

    cfg, _on_a = _archived_on_a(
        shared, user, ev.AttemptEnd(attempt=0, node="a", kind="hang", decision="requeue"))
    verdicts = shared / "archive" / user.name / "42" / "attempt-0" / "a" / VERDICTS
    kept = json.loads(verdicts.read_text())
    assert [r["event"] for r in kept["records"]] == ["attempt.end"]  # root's alone
    b = JobStore(_node_state(shared, "b", user))
    ticks = iter([0.0, 1e9])  # the deadline is past at the first file
    assert earlier_verdicts(cfg, b, job_id="42", user=user.name, attempt=1,
                            clock=lambda: next(ticks, 1e9)) == 0
    verdicts.write_text(json.dumps({**kept, "pad": "x" * VERDICTS_MAX_BYTES}))
    assert earlier_verdicts(cfg, b, job_id="42", user=user.name, attempt=1) == 0
    verdicts.write_text(json.dumps(kept))
    assert earlier_verdicts(cfg, b, job_id="42", user=user.name, attempt=1) == 1
