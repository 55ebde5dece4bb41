"""Helpers shared by test modules that are not set-up (set-up is a fixture in the nearest
conftest.py): the project's test user's name, the framework venv's python, a poll."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# The project's real non-root test user (the ``user`` fixture of tests/conftest.py).
USER = "jwtest"

# The real training frameworks' virtualenv (tools/bootstrap makes it; world-readable, so
# the sandbox's test user runs it too).
FRAMEWORKS_VENV = Path("/opt/jobwrap/frameworks")


def framework_python() -> str:
    """The framework venv's python (torch, lightning, transformers, accelerate, safetensors)."""
    python = FRAMEWORKS_VENV / "bin" / "python"
    if not os.access(python, os.X_OK):
        pytest.fail(f"{python} is missing: run tools/bootstrap (it makes the framework venv)")
    return str(python)


# Tiers and their xdist workers run side by side on one host (tools/test). A test that
# measures CPU or time tightly, or loads torch in several ranks, holds this host-wide lock
# while it runs (marker ``exclusive``; a module fixture with ``host_lock()``), so that no
# two of them share the host's cores. Other tests go on beside it.
HOST_LOCK = Path("/tmp/jobwrap-tests.lock")


@contextlib.contextmanager
def host_lock() -> Iterator[None]:
    fd = os.open(HOST_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def poll(what: str, found: Callable[[], Any], timeout: float) -> Any:
    """``found()``'s first true value, asked every 0.2 s; AssertionError naming ``what``
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout:g} s: {what}")
