"""Fixtures of the login guard's tests."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# What jobwrap needs at run time (pyproject's dependencies).
RUNTIME_DISTRIBUTIONS = ("click", "structlog", "psutil", "nvidia-ml-py")


@pytest.fixture(scope="session")
def user_jobwrap() -> Iterator[str]:
    """A ``jobwrap`` program the test user can run wherever the checkout lives.

    The checkout (and its .venv) may sit in a folder only root can enter, such as
    root's 0700 home: this copies the package and its run-time dependencies to a folder
    everyone can read and runs them with the interpreter behind the venv.
    """
    import importlib.metadata
    import sys

    import wrapper

    base = Path(tempfile.mkdtemp(prefix="jobwrap-user-", dir="/tmp"))
    lib = base / "lib"
    for name in RUNTIME_DISTRIBUTIONS:
        dist = importlib.metadata.distribution(name)
        for entry in dist.files or ():
            if ".." in entry.parts or entry.suffix == ".pyc":
                continue
            source = Path(str(dist.locate_file(entry)))
            if source.is_file():
                (lib / entry).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, lib / entry)
    shutil.copytree(Path(wrapper.__file__).parent, lib / "wrapper",
                    ignore=shutil.ignore_patterns("__pycache__"))
    program = base / "jobwrap"
    # Shaped like the console script pip writes, so the process looks the same.
    program.write_text(f"#!{os.path.realpath(sys.executable)}\nimport sys\n"
                       f"sys.path.insert(0, {str(lib)!r})\n"
                       "from wrapper.entry import main\nsys.exit(main())\n")
    for path in [base, *base.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() or path == program else 0o644)
    yield str(program)
    shutil.rmtree(base)
