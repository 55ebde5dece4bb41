"""Falling back from a checkpoint that crashes the resume (issue 14), driven with fakes.

The pure rule (``policy.suspect`` and ``decide(fallback=...)``) as a matrix, the lookup
that passes suspects over (real files in a temporary checkpoint folder), and the path of
one job through the hook bodies: root's prolog picks the checkpoint (``resume.chosen``),
the epilog judges it suspect and requeues, the next prolog picks the older one, the
task-prolog exports it and says so, and ``jobwrap status`` tells it. Nothing is deleted.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.support.epilog import JobFiles
from wrapper.archive.status import render, timeline
from wrapper.config import Config
from wrapper.hooks import Services, task_prolog
from wrapper.hooks.epilog import decide_attempt
from wrapper.job import events as ev
from wrapper.job.record import JobRecord
from wrapper.job.state import JobState
from wrapper.job.store import JobStore
from wrapper.restart import resume
from wrapper.restart.classify import (
    CANCELLED,
    HARDWARE,
    HOST_OOM,
    NODE_FAILURE,
    PREEMPTED,
    USER_ERROR,
    WALLTIME,
    Classification,
)
from wrapper.restart.policy import PastAttempt, decide, suspect
from wrapper.slurm.context import JobContext
from wrapper.slurm.fake import FakeSlurm
from wrapper.submit.directives import JobOptions

JOB = "91"
GLOB = "ckpt_*.pt"


# -- the pure rule ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", [USER_ERROR, HOST_OOM, HARDWARE, NODE_FAILURE, PREEMPTED,
                                  WALLTIME, CANCELLED, "killed", "collective_timeout"])
@pytest.mark.parametrize("resumed", ["/c/ckpt_3.pt", None])
@pytest.mark.parametrize("latest", ["/c/ckpt_3.pt", "/c/ckpt_4.pt", None])
def test_suspect_only_for_the_jobs_own_failure_with_no_newer_checkpoint(
        kind: str, resumed: str | None, latest: str | None) -> None:
    now = Classification(kind, "d", "sig")
    want = kind in (USER_ERROR, HOST_OOM) and resumed is not None and latest == resumed
    assert suspect(now, resumed_from=resumed, checkpoint_path=latest) is want


SAME = Classification(USER_ERROR, "exit 1; last error: ValueError", "exit:1:0:ValueError")


@pytest.mark.parametrize("history", ["same_error", "no_progress", "first"])
@pytest.mark.parametrize("fallback", [None, ("/c/ckpt_3.pt", "/c/ckpt_2.pt")])
def test_a_fallback_comes_before_the_same_error_and_no_progress_stops(
        history: str, fallback: tuple[str, str] | None) -> None:
    past = {"same_error": [PastAttempt(0, USER_ERROR, SAME.signature, 3)],
            "no_progress": [PastAttempt(0, HOST_OOM, "host_oom", 3)],
            "first": []}[history]
    decision = decide(SAME, attempt=1, max_restarts=5, no_requeue=False, history=past,
                      checkpoint_step=3, checkpoint_path="/c/ckpt_3.pt", node="n1",
                      no_progress_limit=2, fallback=fallback)
    if fallback is not None:
        assert decision.action == "requeue"
        assert "/c/ckpt_3.pt" in decision.reason and "falls back to /c/ckpt_2.pt" in \
            decision.reason
    else:
        assert decision.action == ("requeue" if history == "first" else "stop")


@pytest.mark.parametrize(("attempt", "no_requeue"), [(5, False), (1, True)])
def test_a_fallback_never_passes_the_restart_limit_or_no_requeue(attempt: int,
                                                                 no_requeue: bool) -> None:
    decision = decide(SAME, attempt=attempt, max_restarts=5, no_requeue=no_requeue,
                      history=[], checkpoint_step=3, checkpoint_path="/c/ckpt_3.pt",
                      node="n1", fallback=("/c/ckpt_3.pt", "/c/ckpt_2.pt"))
    assert decision.action == "stop"


# -- the lookup ---------------------------------------------------------------------------
def write_ckpts(folder: Path, steps: Sequence[int], mtime: float) -> None:
    folder.mkdir(exist_ok=True)
    for step in steps:
        path = folder / f"ckpt_{step}.pt"
        path.write_bytes(b"weights %d" % step)
        os.utime(path, (mtime + step, mtime + step))


def test_the_lookup_passes_over_a_suspect_and_what_was_newer_when_judged(
        tmp_path: Path) -> None:
    base = time.time() - 1000
    write_ckpts(tmp_path / "c", [1, 2, 3, 4], base)
    options = JobOptions(checkpoint_glob=GLOB)
    folder = str(tmp_path / "c")
    marked = resume.Suspect(f"{folder}/ckpt_3.pt", 3, base + 3, base + 100)
    found = resume.latest(folder, options, suspects=[marked])
    assert found is not None and found.path == f"{folder}/ckpt_2.pt"
    assert set(found.passed_over) == {f"{folder}/ckpt_3.pt", f"{folder}/ckpt_4.pt"}
    assert resume.latest(folder, options).path.endswith("ckpt_4.pt")  # type: ignore[union-attr]
    # Progress after the verdict counts again, and nothing was deleted.
    write_ckpts(tmp_path / "c", [5], base + 200)
    again = resume.latest(folder, options, suspects=[marked])
    assert again is not None and again.path.endswith("ckpt_5.pt") and not again.passed_over
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [
        f"ckpt_{n}.pt" for n in range(1, 6)]


# -- one job through the hook bodies ------------------------------------------------------
def job(job_files: JobFiles, tmp_path: Path) -> tuple[Config, JobState, JobRecord]:
    return job_files(tmp_path, JOB, "resuming\nValueError: poisoned checkpoint\n",
                     {"max_restarts": 4, "checkpoint_dir": str(tmp_path / "c"),
                      "checkpoint_glob": GLOB})


def epilog(cfg: Config, state: JobState, record: JobRecord, attempt: int
           ) -> tuple[str, str]:
    ctx = JobContext(hook="epilog", job_id=JOB, user="u", uid=os.getuid(), gid=os.getgid(),
                     node="n1", nodes=["n1"], gpus=[0], attempt=attempt, exit_code=1,
                     exit_signal=0)
    slurm = FakeSlurm(jobs={JOB: {"JobId": JOB, "JobState": "FAILED", "Requeue": "1"}})
    decision, _ = decide_attempt(ctx, cfg, state, record, slurm, gpu_check_failed=False,
                                 services=Services(cfg, spawn=lambda argv: None))
    return decision.action, decision.reason


def task_prolog_output(cfg: Config, attempt: int) -> str:
    ctx = JobContext(hook="task-prolog", job_id=JOB, user="u", uid=os.getuid(),
                     gid=os.getgid(), node="n1", nodes=["n1"], gpus=[0], attempt=attempt)
    out = io.StringIO()
    task_prolog.run(ctx, cfg, out, {"SLURM_STEP_ID": "batch", "SLURM_PROCID": "0",
                                    "SLURM_LOCALID": "1"}, Services(cfg))
    return out.getvalue()


def test_a_resume_that_crashes_falls_back_to_the_previous_checkpoint(
        tmp_path: Path, job_files: JobFiles) -> None:
    cfg, state, record = job(job_files, tmp_path)
    store = JobStore(state)
    write_ckpts(tmp_path / "c", [1, 2, 3], time.time() - 1000)
    folder = str(tmp_path / "c")
    # Attempt 0 failed after writing three checkpoints (a different error).
    store.record(ev.PrologContext(node="n1", attempt=0))
    store.record(ev.AttemptEnd(attempt=0, node="n1", kind=USER_ERROR,
                               signature="exit:1:0:ValueError: poisoned checkpoint",
                               checkpoint_step=3, decision="requeue"))
    # Attempt 1: root picks ckpt_3; the resume crashes before anything newer appears.
    store.record(ev.PrologContext(node="n1", attempt=1))
    chosen = resume.choose(store, record, attempt=1, node="n1")
    assert chosen is not None and chosen.path == f"{folder}/ckpt_3.pt"
    action, reason = epilog(cfg, state, record, 1)
    assert action == "requeue", reason  # the same error as attempt 0: a fallback first
    suspects = store.suspects()
    assert [(s.path, s.fallback) for s in suspects] == [
        (f"{folder}/ckpt_3.pt", f"{folder}/ckpt_2.pt")]
    assert "falls back to" in Path(record.stdout).read_text()
    # Attempt 2: root's prolog picks ckpt_2, the task-prolog exports it and says why.
    store.record(ev.PrologContext(node="n1", attempt=2))
    picked = resume.choose(store, record, attempt=2, node="n1")
    assert picked is not None and picked.path == f"{folder}/ckpt_2.pt"
    said = task_prolog_output(cfg, 2)
    assert f"export JOBWRAP_RESUME_FROM={folder}/ckpt_2.pt\n" in said
    assert f"falling back past the suspect checkpoint {folder}/ckpt_3.pt" in said
    text = render(JOB, timeline(store))
    assert f"checkpoint {folder}/ckpt_3.pt is suspect" in text
    assert f"resumed from {folder}/ckpt_2.pt, falling back past the suspect" in text
    assert (tmp_path / "c" / "ckpt_3.pt").exists()


def test_no_older_checkpoint_means_no_suspect_and_the_usual_rules(
        tmp_path: Path, job_files: JobFiles) -> None:
    cfg, state, record = job(job_files, tmp_path)
    store = JobStore(state)
    write_ckpts(tmp_path / "c", [3], time.time() - 1000)
    store.record(ev.AttemptEnd(attempt=0, node="n1", kind=USER_ERROR, checkpoint_step=3,
                               signature="exit:1:0:ValueError: poisoned checkpoint",
                               decision="requeue"))
    store.record(ev.PrologContext(node="n1", attempt=1))
    resume.choose(store, record, attempt=1, node="n1")
    action, reason = epilog(cfg, state, record, 1)
    assert action == "stop" and "the same error" in reason
    assert store.suspects() == []


def test_progress_after_the_resume_is_not_a_suspect(tmp_path: Path,
                                                    job_files: JobFiles) -> None:
    cfg, state, record = job(job_files, tmp_path)
    store = JobStore(state)
    write_ckpts(tmp_path / "c", [1, 2], time.time() - 1000)
    store.record(ev.PrologContext(node="n1", attempt=1))
    resume.choose(store, record, attempt=1, node="n1")
    write_ckpts(tmp_path / "c", [3], time.time() - 500)  # the attempt got further
    action, _ = epilog(cfg, state, record, 1)
    assert action == "requeue" and store.suspects() == []


def test_the_users_claim_of_a_resume_point_is_not_roots_fact(
        tmp_path: Path, job_files: JobFiles) -> None:
    cfg, state, record = job(job_files, tmp_path)
    store = JobStore(state)
    write_ckpts(tmp_path / "c", [1, 2, 3], time.time() - 1000)
    store.record(ev.PrologContext(node="n1", attempt=1))
    # A line the job's user wrote in its own event file, shaped like root's.
    fake = ev.ResumeChosen(attempt=1, node="n1", path=f"{tmp_path}/c/ckpt_3.pt",
                           mtime=(tmp_path / "c" / "ckpt_3.pt").stat().st_mtime)
    state.append(fake.KIND, as_user=True, **fake.encode())
    assert store.resumed_from(1) is None
    action, _ = epilog(cfg, state, record, 1)
    assert action == "requeue" and store.suspects() == []


def test_the_manifest_resume_point_is_roots_pick_not_the_users() -> None:
    from wrapper.archive import rerun

    events = [ev.AttemptEnd(attempt=1, checkpoint_path="/ck/step-3"),
              ev.ResumeChosen(attempt=2, source="user", path="/ck/evil"),
              ev.ResumeChosen(attempt=2, path="/ck/step-2")]
    assert rerun.resume_point(events, 2) == "/ck/step-2"
    assert rerun.resume_point(events[:2], 2) == "/ck/step-3"
