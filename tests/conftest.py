"""Fixtures shared by every tier: a clean log (ours and structlog) per test, a hostile path,
the project's real non-root test user, folders that user can reach, and a small tmpfs."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import structlog

from tests.support import USER, host_lock
from wrapper import log
from wrapper.osl.users import UserIds
from wrapper.staging.scratch import remove_scratch

# The real local Slurm cluster, for the end-to-end and adversarial tiers.
pytest_plugins = ["tests.sandbox"]


# The longest files of the e2e and adversarial tiers (their tests' sum, in minutes on one
# tier's worker): run first, so that pytest-xdist's workers (--dist loadfile, which hands
# out files in collection order) do not end on one of them while the other waits.
LONGEST_FIRST = ("test_frameworks.py", "test_hang.py", "test_walltime.py",
                 "test_restart.py", "test_slurm_restarts.py", "test_spares.py",
                 "test_demo.py", "test_unchecked.py", "test_slurm25.py", "test_faults.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    order = list(LONGEST_FIRST)
    if os.environ.get("JOBWRAP_SLURM_PREFIX"):
        # the built Slurm's tier runs beside Debian's: its torch file, which holds the
        # host lock for minutes, comes a few minutes in rather than wait on the other's
        order.insert(4, order.pop(0))
    rank = {name: i for i, name in enumerate(order)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: else as found


@pytest.fixture(scope="session", autouse=True)
def _user_side_modules_loaded() -> None:
    """Every jobwrap module imported by this test process before any test runs.

    Root's code reads a user's files in a child forked with the user's rights (osl.child),
    and a module that child imports lazily is read then, as the user. A real install is
    world-readable (the sandbox's runtime is); a checkout in root's 0700 home (CI's) is
    not, and whether the child could import it would depend on which tests this process
    (an xdist worker, a tier) happened to run before."""
    import importlib
    import pkgutil

    import wrapper
    from wrapper.checkpoints.layout import registered

    for module in pkgutil.walk_packages(wrapper.__path__, "wrapper."):
        if module.name.endswith("__main__"):
            continue
        with contextlib.suppress(ImportError):  # the framework scripts need torch
            importlib.import_module(module.name)
    registered()


@pytest.fixture(autouse=True)
def _exclusive(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests marked ``exclusive`` hold the host-wide lock (tests.support.host_lock)."""
    if request.node.get_closest_marker("exclusive") is None:
        yield
        return
    with host_lock():
        yield


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


@pytest.fixture
def root() -> None:
    """The test acts as root does (CI runs as root): anywhere else it fails, never skips."""
    if os.geteuid() != 0:
        pytest.fail("this test runs as root (as CI does): root's own behaviour is its subject")


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


@pytest.fixture
def area() -> Iterator[Path]:
    """A folder under /tmp every user can reach (pytest's tmp_path is root's, 0700),
    removed without following links."""
    path = Path(tempfile.mkdtemp(prefix="jw-staging-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        remove_scratch(path)


@pytest.fixture
def tmpfs() -> Callable[..., AbstractContextManager[Path]]:
    """Mounts a small tmpfs for a block: ``with tmpfs(path, "2m") as mount:``, unmounted
    when the block ends. Mounting must work here (no skip if it does not)."""

    @contextlib.contextmanager
    def mount(path: Path, size: str = "2m") -> Iterator[Path]:
        path.mkdir(exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755",
                               "tmpfs", str(path)], capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            pytest.fail(f"this test needs a small tmpfs (mount -t tmpfs -o size={size} tmpfs "
                        f"{path}) and mounting failed: {done.stderr.strip()}; run it as root "
                        "on a machine that allows mounts")
        try:
            yield path
        finally:
            subprocess.run(["umount", "-l", str(path)], check=False)

    return mount
