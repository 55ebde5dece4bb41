"""``jobwrap run``: what it leaves in the job's record, and what the epilog tells a job
that did not use it."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_epilog_matrix import JOB, setup
from wrapper.config import Config, PathsConfig
from wrapper.directives import parse_args
from wrapper.hooks import Services
from wrapper.hooks.epilog import decide_attempt
from wrapper.job import events as ev
from wrapper.job.store import JobStore
from wrapper.restart.apply import in_place_hint
from wrapper.restart.classify import Classification
from wrapper.restart.policy import Decision
from wrapper.runloop import FORWARDED, run
from wrapper.state import JobState


@pytest.fixture
def handlers() -> Iterator[None]:
    """``run`` installs its signal forwarder: put pytest's handlers back."""
    saved = {signum: signal.getsignal(signum) for signum in FORWARDED}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_run_notes_in_the_jobs_file_that_it_restarts_in_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handlers: None) -> None:
    cfg = Config(paths=PathsConfig(state_dir=str(tmp_path / "state")))
    state = JobState(tmp_path / "state", JOB)
    state.prepare(os.getuid(), os.getgid())
    monkeypatch.setenv("SLURM_JOB_ID", JOB)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    assert run(["true"], parse_args([]), cfg, say=lambda text: None) == 0
    [started] = [e for e in JobStore(state).events() if isinstance(e, ev.RunStarted)]
    assert (started.attempt, started.node, started.command, started.source) == \
        (2, "n1", "true", "user")


def test_run_outside_a_job_or_its_state_records_nothing_and_still_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handlers: None) -> None:
    cfg = Config(paths=PathsConfig(state_dir=str(tmp_path / "none")))
    monkeypatch.setenv("SLURM_JOB_ID", JOB)  # no state folder for it
    assert run(["false"], parse_args(["--max-restarts=0"]), cfg, say=lambda t: None) == 1
    monkeypatch.delenv("SLURM_JOB_ID")
    assert run(["true"], parse_args([]), cfg, say=lambda text: None) == 0
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize(("kind", "action", "used_run", "hinted"), [
    ("killed", "requeue", False, True),
    ("user_error", "requeue", False, True),
    ("collective_timeout", "requeue", False, True),
    ("killed", "requeue", True, False),  # it runs under jobwrap run already
    ("killed", "stop", False, False),  # nothing restarts at all
    ("hardware", "requeue", False, False),  # wants other nodes
    ("hang", "requeue", False, False),  # ends the whole job either way
])
def test_the_hint_names_what_jobwrap_run_would_have_kept(kind: str, action: str,
                                                          used_run: bool, hinted: bool) -> None:
    hint = in_place_hint(Classification(kind, "x"), Decision(action, "y"), used_run=used_run)
    assert bool(hint) == hinted
    assert not hint or "`jobwrap run -- CMD`" in hint


def test_a_job_under_jobwrap_run_is_not_told_to_use_it(tmp_path: Path) -> None:
    ctx, cfg, state, record, slurm, _ = setup(tmp_path, "killed", "first", True)
    JobStore(state).record(ev.RunStarted(attempt=0, node="n1", command="srun train.py"))
    decision, _ = decide_attempt(ctx, cfg, state, record, slurm, gpu_check_failed=False,
                                 services=Services(cfg, spawn=lambda argv: None))
    told = Path(record.stdout).read_text()
    assert decision.requeue and "ended: killed" in told
    assert "jobwrap run -- CMD" not in told


def test_faulty_nodes_are_roots_and_slurms_facts(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from wrapper.runloop import faulty_nodes
    from wrapper.slurm.fake import FakeSlurm

    cfg = Config(paths=PathsConfig(state_dir=str(tmp_path / "state")))
    state = JobState(tmp_path / "state", JOB)
    state.prepare(os.getuid(), os.getgid())
    monkeypatch.setenv("SLURM_JOB_ID", JOB)
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-3]")
    healthy = {"State": "MIXED", "Reason": ""}
    slurm = FakeSlurm(nodes={"n1": healthy, "n2": healthy, "n3": healthy})
    assert faulty_nodes(cfg, 0, slurm) == {}
    # the user's own word is no fault; a watcher's (root's) on this node is
    state.append("watch.fault", as_user=True, node="n1", attempt=0, reason="forged")
    assert faulty_nodes(cfg, 0, slurm) == {}
    JobStore(state).record(ev.WatchFault(node="n1", attempt=0, reason="xid 79 on gpu0"))
    slurm.nodes["n2"] = {"State": "MIXED+DRAIN", "Reason": "jobwrap: xid gpu1 [root@t]"}
    slurm.nodes["n3"] = {"State": "DOWN*", "Reason": "Not responding"}
    assert faulty_nodes(cfg, 0, slurm) == {"n1": "xid 79 on gpu0", "n2": "jobwrap: xid gpu1",
                                           "n3": "Slurm lost it (DOWN*)"}
    assert faulty_nodes(cfg, 1, slurm).keys() == {"n2", "n3"}  # n1's fault was attempt 0's


def test_no_restart_in_place_on_a_faulty_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              handlers: None) -> None:
    import wrapper.runloop as runloop

    said: list[str] = []
    monkeypatch.setattr(runloop, "faulty_nodes", lambda cfg, attempt: {"n2": "jobwrap: xid"})
    marker = tmp_path / "runs"
    code = run(["sh", "-c", f"echo run >> {marker}; kill -9 $$"],
               parse_args(["--max-restarts=3"]), Config(), say=said.append)
    assert code == 128 + signal.SIGKILL
    assert marker.read_text() == "run\n"  # started once, never again
    assert "not restarting in place: a node of the job is faulty (n2: jobwrap: xid)" in said[-1]


def test_run_takes_the_jobs_directives_where_its_command_line_is_silent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from wrapper import jobrecord
    from wrapper.jobrecord import JobRecord
    from wrapper.runloop import with_directives

    cfg = Config(paths=PathsConfig(state_dir=str(tmp_path / "state")))
    state = JobState(tmp_path / "state", JOB)
    state.prepare(os.getuid(), os.getgid())
    state.write_json(jobrecord.RECORD, JobRecord(
        job_id=JOB, user="u", uid=os.getuid(), gid=os.getgid(), nodes=["n1"], gpus=[],
        work_dir=str(tmp_path), options={"checkpoint_dir": "ckpt", "max_restarts": 4,
                                         "checkpoint_glob": "step_*"}).as_dict())
    assert with_directives(parse_args([]), cfg) == parse_args([])  # not in a job
    monkeypatch.setenv("SLURM_JOB_ID", JOB)
    merged = with_directives(parse_args([]), cfg)
    assert (merged.checkpoint_dir, merged.max_restarts, merged.checkpoint_glob) == \
        (str(tmp_path / "ckpt"), 4, "step_*")
    own = with_directives(parse_args(["--max-restarts=0", "--checkpoint-dir=/elsewhere"]), cfg)
    assert (own.checkpoint_dir, own.max_restarts, own.checkpoint_glob) == \
        ("/elsewhere", 0, "step_*")
    monkeypatch.setenv("SLURM_JOB_ID", "999")  # no record of that job: its own options
    assert with_directives(parse_args(["--max-restarts=2"]), cfg) == \
        parse_args(["--max-restarts=2"])
