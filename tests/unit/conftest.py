"""Fixtures of the unit tier beyond those of tests/conftest.py."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import archive as archive_builders
from tests.support.epilog import CASES, JOB, MAX_RESTARTS, EpilogCase, JobFiles
from tests.support.staging import HOSTILE, Jobs
from wrapper.archive import archive_attempt
from wrapper.archive.index import SqliteIndex
from wrapper.config import Config, PathsConfig
from wrapper.job import events as ev
from wrapper.job import record as jobrecord
from wrapper.job.paths import SUPERVISOR_FACTS
from wrapper.job.record import JobRecord
from wrapper.job.state import JobState
from wrapper.job.store import JobStore
from wrapper.osl.users import UserIds
from wrapper.slurm.context import JobContext
from wrapper.slurm.fake import FakeSlurm


@pytest.fixture(autouse=True)
def _no_log_on_the_host(monkeypatch: pytest.MonkeyPatch,
                        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A hook that falls back to the built-in config (a bad one given) logs to [log] file's
    default, and as root makes its folder: here, in a folder of the test's, never the
    host's /var/log/jobwrap; and a log file that cannot be written sends nothing to the
    host's syslog (tests/unit/test_log.py checks what would go there)."""
    from wrapper import log
    from wrapper.config import LogConfig

    real, default = log.open_log_file, LogConfig().file

    def open_log_file(path: str) -> int:
        if path == default:
            path = str(tmp_path_factory.mktemp("default-log") / "jobwrap" / "jobwrap.log")
        return real(path)

    monkeypatch.setattr(log, "open_log_file", open_log_file)
    monkeypatch.setattr(log, "_syslog", lambda level, line: None)


@pytest.fixture
def make_dataset() -> Callable[..., Path]:
    """Builds a dataset: ``make_dataset(root, big=3 << 20)``."""

    def make(root: Path, *, big: int = 3 << 20) -> Path:
        """A tree with nested folders, empty/odd-sized/large files, an executable, a symlink
        and a hostile name; readable by everyone."""
        (root / "sub" / "deep").mkdir(parents=True)
        (root / "empty-dir").mkdir()
        (root / "a.txt").write_text("hello\n")
        (root / "sub" / "one-byte").write_bytes(b"x")
        (root / "sub" / "big.bin").write_bytes(os.urandom(big) + b"!")
        (root / "sub" / "deep" / "empty").write_bytes(b"")
        (root / "sub" / HOSTILE).write_bytes(os.urandom(10240))
        (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
        os.chmod(root / "run.sh", 0o755)  # noqa: S103 - an executable in the dataset
        os.chmod(root / "a.txt", 0o640 | 0o004)
        os.symlink("../a.txt", root / "sub" / "link-to-a")
        for i, path in enumerate(sorted(root.rglob("*"))):
            os.utime(path, ns=(1_600_000_000_000_000_000 + i * 1_000_001,) * 2,
                     follow_symlinks=False)
        for path in [root, *root.rglob("*")]:
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o755)
        return root

    return make


@pytest.fixture
def jobs(area: Path, user: UserIds) -> Jobs:
    """Stages job after job on one node, each into its own scratch under ``area``:
    ``scratch, item = jobs.stage(f"{dataset}:data", cache)``."""
    return Jobs(area, user)


# A job of the test user under ``shared`` as the archive and goodput tests need it. The
# builders stay plain functions in tests/support/archive.py: tests/bench calls them too.
@pytest.fixture
def archive_config(shared: Path) -> Callable[..., Config]:
    """``archive_config(**archive)``: a config whose state, archive and log live under
    ``shared``, with those ``[archive]`` settings."""
    return functools.partial(archive_builders.config, shared)


@pytest.fixture
def job_record(shared: Path, user: UserIds) -> Callable[..., JobRecord]:
    """``job_record(job_id="42", **fields)``: root's record of a job of the test user that
    works in ``shared``/work."""
    return functools.partial(archive_builders.record, shared, user)


@pytest.fixture
def user_state(shared: Path, user: UserIds) -> Callable[..., JobState]:
    """``user_state(job_id="42")``: the job's state folder under ``shared``/state, prepared
    for the test user."""
    return functools.partial(archive_builders.state, shared, user)


@pytest.fixture
def archived(shared: Path, user: UserIds) -> str:
    """A config path, and job 42 (two attempts) archived under it."""
    cfg_path = archive_builders.config_file(shared, "max_age_days = 0.5\n")
    cfg = archive_builders.config(shared, max_age_days=0.5)
    work = archive_builders.work_dir(shared, user)
    archive_builders.user_file(work / "job-42.out", user, "hello from the job\n")
    job = archive_builders.state(shared, user)
    rec = archive_builders.record(shared, user, nodes=["n1"])
    archive_builders.run_attempt(job, 0, ["n1"], kind="hang", decision="requeue",
                                 checkpoints=(5,))
    archive_attempt(cfg, job, rec, attempt=0, node="n1", script_text="#!/bin/sh\n",
                    extra={"slurm": {"JobName": "train"}})
    archive_builders.run_attempt(job, 1, ["n1"], checkpoints=(9,))
    archive_attempt(cfg, job, rec, attempt=1, node="n1", script_text="#!/bin/sh\n",
                    extra={"slurm": {"JobName": "train"}})
    SqliteIndex(f"{shared}/archive").rebuild()  # as an installed cluster has it
    return cfg_path


@pytest.fixture
def job_files() -> JobFiles:
    """Writes one job of this user: ``job_files(tmp_path, job_id, output, options)``."""

    def make(tmp_path: Path, job_id: str, output: str, options: dict[str, object]
             ) -> tuple[Config, JobState, JobRecord]:
        """A site under ``tmp_path`` and one job's state, record and output (this user's)."""
        cfg = Config(paths=PathsConfig(state_dir=str(tmp_path / "state"),
                                       scratch_root=str(tmp_path / "scratch"),
                                       archive_root=str(tmp_path / "archive")))
        state = JobState(tmp_path / "state", job_id)
        state.prepare(os.getuid(), os.getgid())
        out = tmp_path / "job.out"
        out.write_text(output)
        record = JobRecord(job_id=job_id, user="u", uid=os.getuid(), gid=os.getgid(),
                           nodes=["n1"], gpus=[0], work_dir=str(tmp_path), stdout=str(out),
                           stderr=str(out), options=options)
        state.write_json(jobrecord.RECORD, record.as_dict())
        return cfg, state, record

    return make


@pytest.fixture
def epilog_case(job_files: JobFiles) -> EpilogCase:
    """Writes job JOB's attempt as the epilog on n1 finds it once it ended as one of
    CASES (tests/support/epilog.py), after a history, with requeue allowed or not:
    ``ctx, cfg, state, record, slurm, gpu_check_failed = epilog_case(tmp_path, kind,
    history, allowed)``."""

    def make(tmp_path: Path, kind: str, history: str, allowed: bool
             ) -> tuple[JobContext, Config, JobState, JobRecord, FakeSlurm, bool]:
        code, slurm_state, tail, extra = CASES[kind]
        cfg, state, record = job_files(tmp_path, JOB, "step 1\n" + tail,
                                       {"max_restarts": MAX_RESTARTS})
        attempt = {"first": 0, "one_failure_before": 1, "at_limit": MAX_RESTARTS}[history]
        store = JobStore(state)
        if extra != "prolog_skipped":
            store.record(ev.PrologContext(node="n1", hook="prolog", attempt=attempt))
        if history == "one_failure_before":
            store.record(ev.AttemptEnd(attempt=0, node="n1", kind="user_error",
                                       detail="exit 1", signature="exit:1:0:",
                                       decision="requeue"))
        if extra == "staging_failed":
            store.record(ev.StagingFailed(attempt=attempt, node="n1", direction="in",
                                          error="no such dataset"))
        if extra == "hang_fact":
            path = state.path / SUPERVISOR_FACTS
            path.write_text(json.dumps({"event": "hang", "attempt": attempt}) + "\n")
            path.chmod(0o600)
        slurm = FakeSlurm(jobs={JOB: {"JobId": JOB, "JobState": slurm_state,
                                      "Requeue": "1" if allowed else "0"}})
        ctx = JobContext(hook="epilog", job_id=JOB, user="u", uid=os.getuid(),
                         gid=os.getgid(), node="n1", nodes=["n1"], gpus=[0], attempt=attempt,
                         exit_code=code, exit_signal=0)
        return ctx, cfg, state, record, slurm, extra == "gpu_check_failed"

    return make
