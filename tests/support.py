"""Fixtures shared across test modules: the project's real non-root test user, and a
folder that user can reach."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from wrapper.privileges import UserIds

USER = "jwtest"


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
