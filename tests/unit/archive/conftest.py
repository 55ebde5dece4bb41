"""The archive tests' set-up, as fixtures: the test user and a folder it can reach
(``shared``) come from tests/conftest.py and a job archived twice over (``archived``)
from tests/unit/conftest.py; here are job 42's state, config and work dir under
``shared``, the archive root and the CLI's config file. The builders these use, for a
test that needs another shape, are in tests/support/archive.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.archive import config, config_file, state, work_dir
from wrapper.config import Config
from wrapper.job.state import JobState
from wrapper.osl.users import UserIds


@pytest.fixture
def job(shared: Path, user: UserIds) -> JobState:
    """Job 42's state folder, prepared for the test user as the prolog leaves it."""
    return state(shared, user)


@pytest.fixture
def cfg(shared: Path) -> Config:
    """A config whose state, archive and log live under ``shared``."""
    return config(shared)


@pytest.fixture
def work(shared: Path, user: UserIds) -> Path:
    """Job 42's work dir, the test user's."""
    return work_dir(shared, user)


@pytest.fixture
def root(shared: Path) -> Path:
    """The archive root that ``cfg`` and ``config_path`` name (not made yet)."""
    return shared / "archive"


@pytest.fixture
def config_path(shared: Path) -> str:
    """The CLI's config file: state and archive under ``shared``, no log file."""
    return config_file(shared)
