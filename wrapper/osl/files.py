"""Safe file primitives for paths a user can reach: no-follow, non-blocking, bounded.

Every open here carries ``O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY`` and is checked
with ``fstat`` before one byte moves: a symlink in the last component, a FIFO (whose
open or read would wait for a writer that never comes), a device or a directory is
refused with ``NotRegularFile``. Reads are bounded (a tail, never the whole file);
writes are atomic (a temporary file, fsynced, renamed over the old one) or single
``write`` appends under a lock, with a size cap. Ownership is only ever changed through
a descriptor (``fchown``), never by a name a user could swap for a symlink.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import struct
import time
from pathlib import Path
from typing import Literal

from wrapper.errors import JobwrapError

StrPath = str | os.PathLike[str]
_SAFE = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# a file read below a descriptor, by name, never through a symlink and never blocking
FILE_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UnsafeFileError(JobwrapError):
    """A path is not what a safe open expects (a symlink, a FIFO, a device, a wrong owner)."""


class NotRegularFile(UnsafeFileError):
    """The path names something other than a regular file."""


def open_regular(path: StrPath, flags: int = os.O_RDONLY, mode: int = 0o600, *,
                 dir_fd: int | None = None) -> int:
    """Open a regular file without following a final symlink and without blocking.

    Raises OSError as ``os.open`` does (a symlink is ELOOP), and NotRegularFile for a
    FIFO, a device, a socket or a directory; the descriptor is closed then.
    """
    fd = os.open(path, flags | _SAFE, mode, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(f"{os.fspath(path)} is not a regular file "
                                 f"({_kind(info.st_mode)}); refusing to use it")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_tail(path: StrPath, max_bytes: int, *, dir_fd: int | None = None) -> bytes:
    """At most the last ``max_bytes`` of a regular file (never more, even if it grows)."""
    fd = open_regular(path, dir_fd=dir_fd)
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - max_bytes)
        chunks: list[bytes] = []
        got = 0
        while got < max_bytes:
            chunk = os.pread(fd, min(1 << 20, max_bytes - got), start + got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_tail_text(path: StrPath, max_bytes: int = 65536) -> str:
    """``read_tail`` decoded leniently; "" when the file does not exist."""
    try:
        return read_tail(path, max_bytes).decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def atomic_write(path: StrPath, data: bytes, *, mode: int = 0o600, uid: int = -1,
                 gid: int = -1) -> None:
    """Replace ``path`` by a complete, fsynced file with ``mode`` (and owner) in one rename.

    The temporary file is new (``O_EXCL``, no-follow) in the same folder; a crash leaves
    either the old file or the new one, and at worst a stray ``.*.tmp``.
    """
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, _NEW, 0o600)
    try:
        if uid != -1 or gid != -1:
            os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
        write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dir_fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


Appended = Literal["ok", "missing", "full"]


def append_line(path: StrPath, line: bytes, *, cap: int | None = None,
                create_mode: int | None = None, lock_timeout: float = 5.0,
                sync: bool = False, lock_path: StrPath | None = None) -> Appended:
    """Append one line in a single ``write`` under an exclusive lock (no torn lines).

    ``"missing"`` when the file is absent and ``create_mode`` is None; ``"full"`` when
    the line would take the file past ``cap`` bytes (nothing is written). A lock held
    longer than ``lock_timeout`` is an UnsafeFileError, never an endless wait.

    The lock is on the file itself, or with ``lock_path`` on that file (made 0600 by
    the caller's uid): a file others may read (root's record, read through an ACL by the
    job's user) must be locked through one they cannot open, since ``flock`` needs only
    a descriptor open for reading and a reader could hold it for ever.
    """
    if not line.endswith(b"\n"):
        line += b"\n"
    flags = os.O_WRONLY | os.O_APPEND | (os.O_CREAT if create_mode is not None else 0)
    try:
        fd = open_regular(path, flags, create_mode if create_mode is not None else 0o600)
    except FileNotFoundError:
        return "missing"
    lock_fd = -1
    try:
        if lock_path is None:
            lock(fd, lock_timeout, os.fspath(path))
        else:
            lock_fd = open_regular(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            info = os.fstat(lock_fd)
            if info.st_uid != os.geteuid() or info.st_mode & 0o077:
                raise UnsafeFileError(f"{os.fspath(lock_path)} is not a private lock file "
                                      f"of uid {os.geteuid()} (mode {info.st_mode & 0o777:o},"
                                      f" owner {info.st_uid}); remove it")
            lock(lock_fd, lock_timeout, os.fspath(path))
        if cap is not None and os.fstat(fd).st_size + len(line) > cap:
            return "full"
        write_all(fd, line)
        if sync:
            os.fsync(fd)
    finally:
        if lock_fd >= 0:
            os.close(lock_fd)
        os.close(fd)
    return "ok"


def append_text_line(path: str, line: str) -> bool:
    """Append one line of text to an existing regular file (the job's output, as its
    user); False if it is not there. JSON-friendly, for ``call_as``."""
    return append_line(path, line.rstrip("\n").encode(errors="surrogateescape")) == "ok"


def lock(fd: int, timeout: float, what: str) -> None:
    """An exclusive flock on ``fd``, waiting at most ``timeout`` seconds."""
    give_up = time.monotonic() + max(0.0, timeout)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= give_up:
                raise UnsafeFileError(f"{what} is locked by another writer (waited "
                                      f"{timeout:.0f} s)") from None
            time.sleep(0.02)


def private_mkdir(path: StrPath, mode: int, *, owner: int | None = None) -> os.stat_result:
    """mkdir ``path`` (or find it) as a real directory owned by ``owner`` (default: us),
    with exactly ``mode``; a symlink, a file or another owner's folder is refused."""
    uid = os.geteuid() if owner is None else owner
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeFileError(f"{os.fspath(path)} is not a directory (a symlink or a "
                                  "file is in the way)") from None
        raise
    try:
        info = os.fstat(fd)
        if info.st_uid != uid:
            raise WrongOwner(os.fspath(path), info.st_uid, uid)
        if stat.S_IMODE(info.st_mode) != mode:
            os.fchmod(fd, mode)
            info = os.fstat(fd)
        return info
    finally:
        os.close(fd)


def owned_alone(info: os.stat_result, uid: int | None = None, *,
                private: bool = False) -> bool:
    """Whether ``info`` is owned by ``uid`` (default: us) and writable by it alone (no
    group or other write bit): a file or folder root may trust, nobody else can change.
    With ``private``, nobody else may even read or enter it (no group or other bit)."""
    return info.st_uid == (os.geteuid() if uid is None else uid) \
        and not info.st_mode & (0o077 if private else 0o022)


def require_owned_alone(fd: int, shown: str, uid: int | None = None) -> None:
    """``owned_alone`` of an open descriptor, else NotOwnedAlone saying what it found."""
    info = os.fstat(fd)
    if not owned_alone(info, uid):
        raise NotOwnedAlone(shown, info, os.geteuid() if uid is None else uid)


class NotOwnedAlone(UnsafeFileError):
    """A file or folder root must trust is another's, or others can write it."""

    def __init__(self, shown: str, info: os.stat_result, wanted: int) -> None:
        super().__init__(f"{shown} must be owned by uid {wanted} and writable by it alone "
                         f"(it is uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o})")


class WrongOwner(UnsafeFileError):
    """A folder that should be ours belongs to someone else."""

    def __init__(self, path: str, found: int, wanted: int) -> None:
        super().__init__(f"{path} is owned by uid {found}, not by uid {wanted}")
        self.path, self.found, self.wanted = path, found, wanted


def chown_fd(fd: int, uid: int, gid: int = -1) -> None:
    """Change an open file's owner: by descriptor, so no swapped-in name is ever followed."""
    os.fchown(fd, uid, gid)


def chown_nofollow(path: StrPath, uid: int, gid: int = -1, *,
                   dir_fd: int | None = None) -> None:
    """Change the owner of a regular file or directory at ``path`` through a descriptor
    opened with ``O_NOFOLLOW``; a symlink in its place is refused, never followed."""
    try:
        fd = os.open(path, os.O_RDONLY | _SAFE, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFileError(f"{os.fspath(path)} is a symlink; refusing to change "
                                  "its owner") from None
        raise
    try:
        info = os.fstat(fd)
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
            raise NotRegularFile(f"{os.fspath(path)} is {_kind(info.st_mode)}; refusing to "
                                 "change its owner")
        os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


_ACL_XATTR = "system.posix_acl_access"
_ACL_UNDEFINED_ID = 0xFFFFFFFF
# struct posix_acl_xattr_entry tags (linux/posix_acl_xattr.h)
_ACL_USER_OBJ, _ACL_USER, _ACL_GROUP_OBJ, _ACL_MASK, _ACL_OTHER = 0x01, 0x02, 0x04, 0x10, 0x20


def acl_bytes(uid: int, user_perm: int, mode: int) -> bytes:
    """A POSIX access ACL: ``mode`` for owner/group/other, plus ``user_perm`` for ``uid``."""
    owner, group, other = (mode >> 6) & 7, (mode >> 3) & 7, mode & 7
    entries = [(_ACL_USER_OBJ, owner, _ACL_UNDEFINED_ID), (_ACL_USER, user_perm, uid),
               (_ACL_GROUP_OBJ, group, _ACL_UNDEFINED_ID),
               (_ACL_MASK, user_perm | group, _ACL_UNDEFINED_ID),
               (_ACL_OTHER, other, _ACL_UNDEFINED_ID)]
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def grant_read(fd: int, uid: int, *, is_dir: bool = False) -> bool:
    """Let ``uid`` alone read an open root-owned file (or list a folder) through a POSIX
    ACL, the group and others keeping what the mode says; False where ACLs are not
    supported (the file then stays root's only)."""
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    try:
        os.setxattr(fd, _ACL_XATTR, acl_bytes(uid, 5 if is_dir else 4, mode))
    except OSError:
        return False
    return True
