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

from wrapper.osl.users import UserIds

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


# The real training frameworks' virtualenv (tools/bootstrap makes it; world-readable, so
# the sandbox's test user runs it too).
FRAMEWORKS_VENV = Path("/opt/jobwrap/frameworks")


def framework_python() -> str:
    """The framework venv's python (torch, lightning, transformers, accelerate, safetensors)."""
    python = FRAMEWORKS_VENV / "bin" / "python"
    if not os.access(python, os.X_OK):
        pytest.fail(f"{python} is missing: run tools/bootstrap (it makes the framework venv)")
    return str(python)
