"""Fixtures of the staging tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.staging import MakeDataset


@pytest.fixture
def dataset(area: Path, make_dataset: MakeDataset) -> Path:
    """The dataset (see make_dataset), in a folder every user can read."""
    return make_dataset(area / "shared" / "ds")
