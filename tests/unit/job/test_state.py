from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from wrapper.errors import StateError
from wrapper.job.state import ROOT_EVENTS, USER_EVENTS, JobState


def test_append_and_read_back(tmp_path: Path) -> None:
    state = JobState(tmp_path / "state", "42")
    state.prepare(None, None)
    state.append("prolog.context", node="n1", gpus=[0, 1])
    state.append("epilog.context", node="n1")
    events = state.events()
    assert [e["event"] for e in events] == ["prolog.context", "epilog.context"]
    assert events[0]["gpus"] == [0, 1]
    assert events[0]["source"] == "root"
    assert (tmp_path / "state" / "jobs" / "42" / ROOT_EVENTS).exists()


@pytest.mark.parametrize("job_id", ["../etc", "1/2", "", "12a", "1" * 13])
def test_job_ids_that_would_escape_are_refused(tmp_path: Path, job_id: str) -> None:
    with pytest.raises(StateError, match="not a job id"):
        JobState(tmp_path, job_id)


def test_user_file_owned_by_job_user(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("this test checks chown and must run as root, as CI does")
    state = JobState(tmp_path / "state", "7")
    state.prepare(4242, 4243)
    info = os.lstat(state.path / USER_EVENTS)
    assert (info.st_uid, info.st_gid) == (4242, 4243)
    assert info.st_mode & 0o777 == 0o600  # not the group: a rival may share it
    state.prepare(4242, 4243)  # idempotent: a second node's prolog on shared state


def test_a_reused_job_id_of_another_user_gets_a_fresh_folder(tmp_path: Path) -> None:
    state = JobState(tmp_path / "state", "8")
    state.prepare(4141, 4141)  # an earlier job 8, another user's
    state.append("gpu.fault", as_user=True, reason="old user's")
    state.append("attempt.end", kind="success")
    state.prepare(4242, 4242)  # the new job 8: never fails, nothing of the old one left
    info = os.lstat(state.path / USER_EVENTS)
    assert info.st_uid == 4242 and info.st_size == 0
    assert state.events() == []
    assert [p.name for p in (tmp_path / "state" / "jobs").iterdir()] == ["8"]


def test_symlink_in_place_of_the_event_file_is_not_followed(tmp_path: Path) -> None:
    state = JobState(tmp_path / "state", "9")
    state.prepare(None, None)
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    os.symlink(target, state.path / ROOT_EVENTS)
    with pytest.raises(StateError):
        state.append("x")
    assert target.read_text() == "keep me\n"


def test_symlinked_job_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "state" / "jobs").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, tmp_path / "state" / "jobs" / "10")
    with pytest.raises(StateError, match="not a directory"):
        JobState(tmp_path / "state", "10").prepare(None, None)


def test_user_append_needs_the_file_the_prolog_made(tmp_path: Path) -> None:
    state = JobState(tmp_path / "state", "11")
    state.prepare(None, None)
    with pytest.raises(StateError, match="did it run on this node"):
        state.append("task-prolog.context", as_user=True)


def _writer(path: str, who: int, count: int) -> None:
    state = JobState(Path(path), "5")
    for i in range(count):
        state.append("tick", who=who, i=i, pad="x" * 3000)


def test_concurrent_writers_never_tear_lines(tmp_path: Path) -> None:
    state = JobState(tmp_path / "state", "5")
    state.prepare(None, None)
    procs = [multiprocessing.Process(target=_writer, args=(str(tmp_path / "state"), w, 100))
             for w in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    lines = (state.path / ROOT_EVENTS).read_text().splitlines()
    assert len(lines) == 400
    records = [json.loads(line) for line in lines]  # every line is whole JSON
    for who in range(4):
        assert [r["i"] for r in records if r["who"] == who] == list(range(100))


def test_a_torn_last_line_is_skipped_not_fatal(tmp_path: Path) -> None:
    state = JobState(tmp_path / "state", "6")
    state.prepare(None, None)
    state.append("ok")
    with open(state.path / ROOT_EVENTS, "a") as handle:
        handle.write('{"event": "cut')
    assert [e["event"] for e in state.events()] == ["ok"]


def test_only_the_capped_tail_of_the_user_file_is_read(tmp_path: Path) -> None:
    state = JobState(tmp_path / "state", "11", user_events_max=4096)
    state.prepare(None, None)
    with (state.path / USER_EVENTS).open("a") as handle:
        handle.write('{"ts": 1, "event": "old"}\n')
        handle.write('{"ts": 2, "event": "filler"}\n' * 1000)
        handle.write('{"ts": 3, "event": "new"}\n')
    seen = [e["event"] for e in state.events()]
    assert "old" not in seen and seen[-1] == "new"
    assert len(seen) < 4096 // 20


def test_stale_user_files_are_pruned_by_root_record_age_at_most_hourly(tmp_path: Path) -> None:
    from wrapper.job.state import prune_stale_user_files

    old, recent = JobState(tmp_path, "21"), JobState(tmp_path, "22")
    for state in (old, recent):
        state.prepare(None, None)
        state.append("prolog.context")
        (state.path / USER_EVENTS).write_text('{"event": "x"}\n')
    now = time.time()
    week = 7 * 86400
    # The user's own file is fresh: only root's record tells the job's age.
    os.utime(old.path / "events.jsonl", (now - week - 10, now - week - 10))
    assert prune_stale_user_files(tmp_path, week, now) == 1
    assert not (old.path / USER_EVENTS).exists()
    assert (old.path / "events.jsonl").exists() and (recent.path / USER_EVENTS).exists()
    # Within the hour the jobs folder is not scanned again.
    os.utime(recent.path / "events.jsonl", (now - week - 10, now - week - 10))
    assert prune_stale_user_files(tmp_path, week, now + 60) == 0
    assert prune_stale_user_files(tmp_path, week, now + 3700) == 1


def test_root_events_are_bounded_whatever_user_text_they_carry(tmp_path: Path) -> None:
    """Issue 22, item 7: 64 ranks with a 128 KiB RANK each once wrote an 8 MiB line."""
    from wrapper.job.state import FIELD_MAX, LINE_MAX

    state = JobState(tmp_path, "5")
    state.prepare(None, None)
    big = "r" * (128 << 10)
    state.append("watch.forensics", attempt=0, node="n1",
                 ranks=[{"rank": big, "signature": big} for _ in range(64)])
    state.append("attempt.end", attempt=0, node="n1", kind="user_error", detail=big,
                 nested=[[[[[[[[[["deep"]]]]]]]]]])
    lines = (state.path / "events.jsonl").read_bytes().splitlines()
    assert all(len(line) <= LINE_MAX for line in lines)
    events = state.events()
    assert [e["event"] for e in events] == ["watch.forensics", "attempt.end"]
    assert events[0]["attempt"] == 0 and 0 < len(events[0]["ranks"]) <= 64
    assert len(events[1]["detail"]) <= FIELD_MAX + 10 and events[1]["kind"] == "user_error"


def test_what_root_writes_root_reads_back(tmp_path: Path) -> None:
    """A number jsontext would refuse (NaN, a 400-digit step) once made root's own
    attempt.end vanish from every reader."""
    state = JobState(tmp_path, "6")
    state.prepare(None, None)
    state.append("attempt.end", attempt=0, node="n1", kind="user_error",
                 checkpoint_step=10 ** 400, seconds=float("nan"), big=10 ** 31)
    [event] = state.events()
    assert event["kind"] == "user_error" and event["seconds"] is None
    assert event["big"] == 10 ** 31 and isinstance(event["checkpoint_step"], str)


def test_root_only_reads_leave_the_users_file_unread(tmp_path: Path) -> None:
    state = JobState(tmp_path, "8")
    state.prepare(None, None)
    state.append("prolog.context", attempt=0, node="n1")
    (state.path / USER_EVENTS).write_bytes(b"[" * 100_000 + b"\n"
                                           + b'{"event":"checkpoint","attempt":0}\n')
    assert [e["event"] for e in state.events(root_only=True)] == ["prolog.context"]
    assert sorted(e["source"] for e in state.events()) == ["root", "user"]
