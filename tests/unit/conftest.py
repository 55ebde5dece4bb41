"""Fixtures of the unit tier beyond those of tests/conftest.py."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.staging import HOSTILE


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
