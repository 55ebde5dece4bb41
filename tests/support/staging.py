"""Helpers shared by the staging tests (unit and adversarial): a real non-root user,
folders that user can reach, a dataset with awkward names, a byte-for-byte digest, and a
small tmpfs.

The staging tests run as root (as CI does) against the project's test user ``jwtest``,
because what they prove is what root does on the user's behalf.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from wrapper.staging import UserIds
from wrapper.staging.channel import Channel
from wrapper.staging.privileges import Worker
from wrapper.staging.scratch import remove_scratch

TEST_USER = "jwtest"
HOSTILE = "we'ird \"name\"; echo pwned\nline"


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("the staging tests act for a real non-root user and must run as root, "
                    "as CI does")


def jwtest() -> UserIds:
    """The project's test user, created when missing (``useradd -m jwtest``)."""
    require_root()
    try:
        pwd.getpwnam(TEST_USER)
    except KeyError:
        subprocess.run(["useradd", "-m", TEST_USER], check=True)
    return UserIds.lookup(TEST_USER)


@contextlib.contextmanager
def public_dir() -> Iterator[Path]:
    """A folder under /tmp every user can reach (pytest's tmp_path is root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="jw-staging-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        remove_scratch(path)


def make_dataset(root: Path, *, big: int = 3 << 20) -> Path:
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


def digest(root: Path, *, modes: bool = True, mtimes: bool = True,
           resolution_ns: int = 1) -> dict[str, Any]:
    """Everything that must survive staging: kind, content (sha256), link target, mode
    and mtime (to ``resolution_ns``: a tar keeps less than nanoseconds) of every entry
    below ``root``."""
    out: dict[str, Any] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        info = path.lstat()
        row: list[Any] = []
        if stat.S_ISLNK(info.st_mode):
            row = ["link", os.readlink(path)]
        elif stat.S_ISDIR(info.st_mode):
            row = ["dir"]
        else:
            row = ["file", hashlib.sha256(path.read_bytes()).hexdigest()]
        if modes and not stat.S_ISLNK(info.st_mode):
            row.append(oct(stat.S_IMODE(info.st_mode)))
        if mtimes:
            row.append((info.st_mtime_ns + resolution_ns // 2) // resolution_ns)
        out[rel] = row
    return out


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "2m") -> Iterator[Path]:
    """A small tmpfs at ``path``; mounting must work here (no skip if it does not)."""
    path.mkdir(exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                           str(path)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.fail(f"this test needs a small tmpfs (mount -t tmpfs -o size={size} tmpfs "
                    f"{path}) and mounting failed: {done.stderr.strip()}; run it as root on a "
                    "machine that allows mounts")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def as_user(user: UserIds, probe: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``probe`` in a worker holding only ``user``'s rights; returns what it found."""

    def body(channel: Channel) -> None:
        channel.send({"t": "result", "value": probe()})

    with Worker(user, body, timeout=30) as worker:
        message, fds = worker.recv()
        for fd in fds:
            os.close(fd)
        worker.wait()
    value = message["value"]
    assert isinstance(value, dict)
    return value


def try_write(path: Path) -> dict[str, Any]:
    """What a user gets when they try to change ``path``: an errno name, or 'ok'."""
    result = {}
    for what, action in (("write", lambda: os.open(path, os.O_WRONLY)),
                         ("chmod", lambda: os.chmod(path, 0o666)),  # noqa: S103 - the attack
                         ("truncate", lambda: os.truncate(path, 0))):
        try:
            value = action()
            if isinstance(value, int):
                os.close(value)
            result[what] = "ok"
        except OSError as exc:
            result[what] = exc.__class__.__name__
    return result

