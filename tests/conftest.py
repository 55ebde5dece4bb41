"""Fixtures shared by every tier: a clean log (ours and structlog) per test, a hostile path,
the project's real non-root test user, and a folder that user can reach."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from tests.support import USER
from wrapper import log
from wrapper.osl.users import UserIds

# The real local Slurm cluster, for the end-to-end and adversarial tiers.
pytest_plugins = ["tests.sandbox"]


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    log.reset()
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    log.reset()


@pytest.fixture
def weird_tmp_path(tmp_path: Path) -> Path:
    """A folder whose name has quotes, a semicolon, spaces and a newline."""
    path = tmp_path / "we'ird \"dir\"; echo pwned\nline"
    path.mkdir()
    return path


@pytest.fixture(scope="module")
def user() -> UserIds:
    if os.geteuid() != 0:
        pytest.fail("these tests run as root (as CI does): they act as a real non-root user")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", USER], check=True)
    entry = pwd.getpwnam(USER)
    return UserIds.of(entry.pw_uid, entry.pw_gid)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A fresh folder the job user can traverse.

    Not under pytest's tmp_path: every pytest run that starts (other test runs on this
    machine included) sets /tmp/pytest-of-root back to 0700, which would lock the job
    user out in the middle of a test.
    """
    path = Path(tempfile.mkdtemp(prefix="jobwrap-test-", dir="/tmp"))
    os.chmod(path, 0o755)  # noqa: S103
    yield path
    shutil.rmtree(path)
