"""The first node's watcher starts the attempt's supervisor again when it died, with real
processes standing in for the supervisor (found by pid, command line and start time)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from wrapper.job import events as ev
from wrapper.job.state import JobState
from wrapper.watch.keeper import SupervisorKeeper

JOB = "71"


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def fake_supervisor(procs: list[subprocess.Popen[bytes]]) -> str:
    """A process whose command line is a supervisor's of JOB (what ``start`` returns)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)",
                             "supervise", JOB])
    procs.append(proc)
    return f"detached:{proc.pid}"


def setup(tmp_path: Path, procs: list[subprocess.Popen[bytes]], *, how: str = "",
          node: str = "n1") -> tuple[JobState, SupervisorKeeper, list[str]]:
    state = JobState(tmp_path, JOB)
    state.prepare(None, None)
    state.append(ev.PrologContext.KIND, attempt=1, node="n1", hook="prolog", context={})
    state.append(ev.SupervisorStarted.KIND, attempt=1, node="n1",
                 how=how or fake_supervisor(procs))
    restarted: list[str] = []

    def restart() -> str:
        restarted.append(fake_supervisor(procs))
        return restarted[-1]

    return state, SupervisorKeeper(state, job_id=JOB, node=node, attempt=1,
                                   restart=restart, limit=2), restarted


def root(state: JobState, kind: str) -> list[dict[str, object]]:
    return [e for e in state.events() if e["event"] == kind and e["source"] == "root"]


def test_a_killed_supervisor_is_started_again_up_to_the_limit(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    state, keep, restarted = setup(tmp_path, procs)
    keep()
    assert restarted == []  # alive: nothing to do
    for number in (1, 2):
        procs[-1].kill()
        procs[-1].wait()
        keep()
        assert len(restarted) == number
        keep()  # the new one is alive
        assert len(restarted) == number
    assert [(e["how"], e["restarts"]) for e in root(state, "supervisor.restarted")] == [
        (restarted[0], 1), (restarted[1], 2)]
    procs[-1].kill()
    procs[-1].wait()
    keep()
    assert len(restarted) == 2 and keep.done  # a user who kills it in a loop: unsupervised


def test_a_supervisor_that_ended_or_an_attempt_that_ended_is_left_alone(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    for i, (kind, fields) in enumerate([
            (ev.SupervisorEnd.KIND, {"job_state": "RUNNING"}),
            (ev.EpilogContext.KIND, {"hook": "epilog", "context": {}}),
            (ev.PrologContext.KIND, {"hook": "prolog", "context": {}, "attempt": 2})]):
        state, keep, restarted = setup(tmp_path / str(i), procs)
        procs[-1].kill()
        procs[-1].wait()
        record = {"event": kind, "attempt": 1, "node": "n1", **fields}
        if kind == ev.SupervisorEnd.KIND:  # the supervisor's own word, in the user's file
            with open(state.path / "user-events.jsonl", "a") as f:
                f.write(json.dumps({"ts": 9e9, **record}) + "\n")
        else:
            state.append(kind, **{k: v for k, v in record.items() if k != "event"})
        keep()
        assert restarted == [] and keep.done, kind


def test_only_roots_record_of_this_nodes_supervisor_counts(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    # systemd runs it (its unit's restart policy applies): nothing to keep
    state, keep, restarted = setup(tmp_path / "systemd", procs, how="systemd")
    keep()
    assert restarted == [] and keep.done
    # another node's watcher does not keep the first node's supervisor
    state, keep, restarted = setup(tmp_path / "n2", procs, node="n2")
    procs[-1].kill()
    procs[-1].wait()
    keep()
    assert restarted == []
    # the user's own file names a pid of theirs as "the supervisor": root's record wins
    state, keep, restarted = setup(tmp_path / "user", procs)
    decoy = fake_supervisor(procs)
    procs[-2].kill()  # the real one
    procs[-2].wait()
    with open(state.path / "user-events.jsonl", "a") as f:
        f.write(json.dumps({"ts": 9e9, "event": "supervisor.restarted", "attempt": 1,
                            "node": "n1", "how": decoy, "restarts": 0}) + "\n")
        f.write(json.dumps({"ts": "soon", "event": "supervisor.end", "attempt": 1}) + "\n")
    keep()
    assert len(restarted) == 1
