"""Fixtures shared by every tier: a clean log (ours and structlog) per test, and a hostile path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from wrapper import log

# The real non-root test user and a folder it can reach, for every module.
pytest_plugins = ["tests.support", "tests.sandbox"]


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
