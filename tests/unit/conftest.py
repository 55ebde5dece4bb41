"""Fixtures of the unit tier beyond those in tests/support/."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.staging import public_dir


@pytest.fixture
def area() -> Iterator[Path]:
    """A folder under /tmp every user can reach, removed without following links."""
    with public_dir() as path:
        yield path
