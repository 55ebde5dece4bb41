"""Helpers shared by test modules that are not set-up (set-up is a fixture in the nearest
conftest.py): the project's test user's name, and the framework venv's python."""

from __future__ import annotations

import os
from pathlib import Path

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
