"""Fixtures of the unit tier beyond those of tests/conftest.py."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import archive as archive_builders
from tests.support.staging import HOSTILE
from wrapper.archive import archive_attempt
from wrapper.archive.index import SqliteIndex
from wrapper.config import Config
from wrapper.job.record import JobRecord
from wrapper.job.state import JobState
from wrapper.osl.users import UserIds


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
