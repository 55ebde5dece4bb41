"""wrapper.job: typed events (tolerant decode), the store's queries, the generated doc."""

from __future__ import annotations

import os
from pathlib import Path

from jobwrap_dev.eventsdoc import render
from wrapper.job import events as ev
from wrapper.job.paths import JobPaths
from wrapper.job.state import JobState
from wrapper.job.store import JobStore

DOC = Path(__file__).resolve().parents[3] / "docs" / "events.md"


def test_events_md_is_generated_from_the_registry() -> None:
    assert DOC.read_text() == render(), "run tools/events-doc"


def test_every_kind_round_trips() -> None:
    for name, cls in ev.REGISTRY.items():
        event = cls(attempt=3, node="n1")
        back = ev.decode({"ts": 1.5, "event": name, **event.encode()})
        assert type(back) is cls and back == event and back.ts == 1.5


def test_decode_is_tolerant_of_unknown_kinds_and_wrong_types() -> None:
    odd = ev.decode({"event": "from.the.future", "attempt": 2, "x": [1]})
    assert isinstance(odd, ev.Unknown) and odd.name == "from.the.future"
    assert odd.attempt == 2 and odd.extra["x"] == [1]
    end = ev.decode({"event": "attempt.end", "attempt": "7", "exit_code": "x",
                     "checkpoint_step": True, "kind": 5, "source": "user"})
    assert isinstance(end, ev.AttemptEnd)
    assert (end.attempt, end.exit_code, end.checkpoint_step, end.kind) == (0, None, None, "")
    assert not end.from_root
    assert isinstance(ev.decode({}), ev.Unknown)


def test_a_line_that_names_no_attempt_is_left_out_of_the_attempts() -> None:
    """decode reads a missing attempt as 0; decode_attempts (the attempts' story) leaves
    such a line out, and takes a hook context's attempt where a line has none of its own."""
    records = [{"event": "checkpoint", "attempt": 2, "step": 1},
               {"event": "checkpoint", "step": 2},
               {"event": "checkpoint", "attempt": "2", "step": 3},
               {"event": "checkpoint", "attempt": True, "step": 4},
               {"event": "checkpoint", "attempt": 1e999, "step": 5},
               {"event": "prolog.context", "context": {"attempt": 3}},
               {"event": "prolog.context", "attempt": None, "context": {"attempt": 4}},
               {"event": "prolog.context", "attempt": "x", "context": {"attempt": 5}}]
    assert ev.decode(records[1]).attempt == 0
    assert [ev.attempt_of(r) for r in records] == [2, None, None, None, None, 3, 4, None]
    kept = ev.decode_attempts(records)
    assert [(e.KIND, e.attempt) for e in kept] == [
        ("checkpoint", 2), ("prolog.context", 3), ("prolog.context", 4)]
    assert isinstance(kept[1], ev.PrologContext) and kept[1].context == {"attempt": 3}


def test_store_queries_read_root_events_only(tmp_path: Path) -> None:
    state = JobState(tmp_path, "12")
    state.prepare(os.getuid(), os.getgid())
    store = JobStore(state)
    store.record(ev.PrologContext(attempt=0, node="n1"))
    store.record(ev.AttemptEnd(attempt=0, node="n1", kind="hang", detail="idle"))
    store.record(ev.PrologContext(attempt=1, node="n1"))
    store.record(ev.StagingFailed(attempt=1, node="n1", direction="in", error="no\n data"))
    # What the user's side could write says nothing to the queries.
    state.append("prolog.context", as_user=True, attempt=9, node="n1")
    state.append("directives.invalid", as_user=True, attempt=1, node="n2", error="forged")
    assert store.current_attempt() == 1
    assert store.superseded(0) and not store.superseded(1)
    assert store.staging_refusal("n1", 1) == "no data"
    assert store.staging_refusal("n2", 1) == ""
    assert [e.kind for e in store.history(1)] == ["hang"]
    end = store.last_end()
    assert isinstance(end, ev.AttemptEnd) and end.detail == "idle"


def test_the_batch_script_is_kept_once(tmp_path: Path) -> None:
    state = JobState(tmp_path, "12")
    state.prepare(os.getuid(), os.getgid())
    store = JobStore(state)
    assert store.script() is None
    store.save_script("#!/bin/bash\n#JOBWRAP --max-restarts=2\n")
    assert store.script() == "#!/bin/bash\n#JOBWRAP --max-restarts=2\n"
    assert store.paths.batch_script.stat().st_mode & 0o777 == 0o600


def test_paths_name_every_file_and_refuse_a_bad_id(tmp_path: Path) -> None:
    paths = JobPaths(tmp_path, "5", tmp_path / "scratch")
    assert paths.events.name == "events.jsonl" and paths.record.name == "job.json"
    assert paths.scratch == tmp_path / "scratch" / "5"
    try:
        JobPaths(tmp_path, "../5")
    except ValueError as exc:
        assert "not a job id" in str(exc)
    else:
        raise AssertionError("a path-like job id was accepted")
