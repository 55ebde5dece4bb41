"""The few reads layouts make to judge a candidate: a zip's tail, a marker file, a pointer file.

Every open is read-only, non-blocking (a FIFO named like a checkpoint must not hang
discovery) and refuses a symlink, since callers pass paths already resolved inside the
checkpoint directory.
"""

from __future__ import annotations

import os
import stat

from wrapper.checkpoints.layout import Rejected
from wrapper.checkpoints.ziptail import zip_problem

_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_POINTER_LIMIT = 4096


def _open_regular(path: str) -> tuple[int, os.stat_result]:
    fd = os.open(path, _OPEN)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise Rejected("not a regular file")
    return fd, st


def check_zip(path: str) -> float:
    """Reject a file that is not a complete zip archive; return its mtime."""
    fd, st = _open_regular(path)
    try:
        problem = zip_problem(fd, st.st_size)
    finally:
        os.close(fd)
    if problem:
        raise Rejected(problem)
    return st.st_mtime


def is_zip(path: str) -> bool:
    """Whether the file starts like a zip archive (its first local header)."""
    fd, _st = _open_regular(path)
    try:
        return os.pread(fd, 4, 0) == b"PK\x03\x04"
    finally:
        os.close(fd)


def marker_mtime(path: str) -> float | None:
    """The mtime of a completion marker, None when it is absent; never follows a symlink."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        raise Rejected(f"{os.path.basename(path)} is not a regular file")
    return st.st_mtime


def read_pointer(path: str) -> str:
    """The stripped text of a small pointer file (DeepSpeed ``latest``, Megatron's tracker)."""
    name = os.path.basename(path)
    try:
        fd, _st = _open_regular(path)
    except Rejected:
        raise Rejected(f"{name} is not a regular file") from None
    try:
        raw = os.read(fd, _POINTER_LIMIT + 1)
    finally:
        os.close(fd)
    if len(raw) > _POINTER_LIMIT:
        raise Rejected(f"{name} is larger than {_POINTER_LIMIT} bytes: not a pointer file")
    try:
        text = raw.decode().strip()
    except UnicodeDecodeError:
        raise Rejected(f"{name} is not text") from None
    if not text:
        raise Rejected(f"{name} is empty (being rewritten?)")
    return text


def require_nonempty_dir(path: str) -> None:
    with os.scandir(path) as it:
        if next(it, None) is None:
            raise Rejected("empty directory")
