"""No-follow file operations under the archive root, and who may read what is written there.

Everything below the archive root is reached through directory descriptors opened with
``O_NOFOLLOW`` (``wrapper.osl.dirs``): a symlink anywhere inside the root (planted, or
left by a bug) is an ArchiveError, never a detour. Files are created with ``O_EXCL`` and
replaced only by rename. The folder operations are osl's; this module adds the archive's
policy: plain names only, its owners and modes (``Access``), the root, and its errors.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from collections.abc import Iterator
from typing import Any

from wrapper.errors import JobwrapError
from wrapper.fastdataclass import dataclass
from wrapper.osl import dirs, files
from wrapper.osl.dirs import entries, exists
from wrapper.osl.files import acl_bytes

__all__ = ["Access", "ArchiveError", "create_file", "entries", "exists", "locked", "make_dir",
           "make_temp_dir", "open_dir", "open_root", "read_json", "remove_tree", "sync_tree",
           "tree_size", "write_json_atomic"]

_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_ACL_XATTR = "system.posix_acl_access"


class ArchiveError(JobwrapError):
    """The archive cannot be written or read safely (a symlink, a wrong owner, no room)."""


@dataclass(frozen=True)
class Access:
    """Who owns what is written for one user's archives, and who may read it.

    ``group``: root owns it, the job user's group reads it (dirs 0750, files 0640).
    ``acl``: root and an admin group own it; the job user reads it through a POSIX ACL
    entry, so that users who share a primary group cannot read each other's archives.
    """

    gid: int
    acl_uid: int | None = None
    dir_mode: int = 0o750
    file_mode: int = 0o640

    def apply(self, fd: int, *, is_dir: bool) -> None:
        if os.geteuid() == 0:
            os.fchown(fd, 0, self.gid)
        os.fchmod(fd, self.dir_mode if is_dir else self.file_mode)
        if self.acl_uid is not None:
            # after the chmod: a chmod rewrites the ACL mask
            user_perm = 5 if is_dir else 4
            try:
                os.setxattr(fd, _ACL_XATTR, _acl(self.acl_uid, user_perm,
                                                 self.dir_mode if is_dir else self.file_mode))
            except OSError as exc:
                raise ArchiveError(f"cannot grant uid {self.acl_uid} read access with a POSIX "
                                   f"ACL ({exc.strerror}); the archive root's file system "
                                   "needs ACLs for [archive] access = \"acl\"") from None


_acl = acl_bytes  # one ACL encoder, in wrapper.osl.files


def open_root(path: str, *, create: bool, mode: int = 0o711, gid: int = 0) -> int:
    """The archive root's descriptor; creates it (root-owned, ``mode``) when asked to."""
    if create:
        parent = os.path.dirname(path.rstrip("/")) or "/"
        os.makedirs(parent, 0o755, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        else:
            fd = dirs.open_dir(path, follow=True)
            try:
                if os.geteuid() == 0:
                    os.fchown(fd, 0, gid)
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
    try:
        # The root itself is the admin's path and may be a symlink (to shared storage);
        # nothing below it is reached through one.
        fd = dirs.open_dir(path, follow=True)
    except PermissionError:
        if create:
            raise ArchiveError(f"cannot open the archive root {path}: permission denied") \
                from None
        # A user may only pass through the root (0711) to their own folder: a path-only
        # descriptor does that, though it cannot list the root.
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ArchiveError(f"the archive root {path} does not exist") from None
    except OSError as exc:
        raise ArchiveError(f"cannot open the archive root {path}: {_why(exc)}") from None
    if create and os.fstat(fd).st_uid != os.geteuid():
        os.close(fd)
        raise ArchiveError(f"the archive root {path} is not owned by uid {os.geteuid()}")
    return fd


@contextlib.contextmanager
def _no_detour() -> Iterator[None]:
    """A symlink or a file where a folder should be is the archive's error, named."""
    try:
        yield
    except dirs.NotADirectory as exc:
        raise ArchiveError(f"{exc.filename!r} in the archive is not a directory (a symlink "
                           "or a file is in its place); refusing to follow it") from None


def open_dir(parent: int, name: str) -> int:
    """A subdirectory's descriptor; a symlink in its place is refused."""
    _check_name(name)
    with _no_detour():
        return dirs.open_dir(name, dir_fd=parent)


def make_dir(parent: int, name: str, access: Access) -> int:
    """Create (or reuse, when it is ours) a directory with the archive's ownership and mode."""
    _check_name(name)
    with _no_detour():
        fd = dirs.make_dir(parent, name, 0o700)
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise ArchiveError(f"{name!r} in the archive is owned by uid "
                               f"{os.fstat(fd).st_uid}, not by us")
        access.apply(fd, is_dir=True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_temp_dir(parent: int, prefix: str, access: Access) -> str:
    """A new, uniquely named directory; returns its name."""
    for _ in range(100):
        name = f"{prefix}{secrets.token_hex(4)}.tmp"
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:
            continue
        fd = open_dir(parent, name)
        try:
            access.apply(fd, is_dir=True)
        finally:
            os.close(fd)
        return name
    raise ArchiveError("cannot create a temporary directory in the archive")


def create_file(parent: int, name: str, access: Access) -> int:
    """A new file (``O_EXCL``: never an existing one, never through a symlink)."""
    _check_name(name)
    fd = os.open(name, _NEW_FILE, 0o600, dir_fd=parent)
    try:
        access.apply(fd, is_dir=False)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_json_atomic(parent: int, name: str, data: dict[str, Any], access: Access) -> None:
    """Replace ``name`` by a complete, fsynced file in one rename; a crash leaves the old one."""
    tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = create_file(parent, tmp, access)
    try:
        with os.fdopen(fd, "wb", closefd=False) as handle:
            handle.write(json.dumps(data, indent=1, default=str, sort_keys=False).encode())
            handle.flush()
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=parent)
        raise
    os.close(fd)
    os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
    os.fsync(parent)


def read_json(parent: int, name: str, max_bytes: int | None = None) -> dict[str, Any] | None:
    """A JSON object file, or None when it is absent, not a regular file, larger than
    ``max_bytes`` (when given) or not JSON."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     dir_fd=parent)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (max_bytes is not None
                                               and info.st_size > max_bytes):
            return None
        try:
            data = json.load(handle)
        except ValueError:
            return None
    return data if isinstance(data, dict) else None


def tree_size(fd: int) -> int:
    """Bytes in the regular files below a directory; symlinks are not followed."""
    with _no_detour():
        return dirs.tree_size(fd)


def sync_tree(fd: int) -> None:
    """fsync every file and directory below (and including) a directory."""
    with _no_detour():
        dirs.sync_tree(fd)


def remove_tree(parent: int, name: str) -> None:
    """Remove a directory tree without following a symlink in it or crossing into another
    mount (``osl.dirs.remove_tree``); a mount point inside is left, an ArchiveError."""
    _check_name(name)
    removal = dirs.remove_tree(parent, name)
    if removal.left:
        raise ArchiveError(f"{name!r} in the archive holds a mount point "
                           f"({', '.join(removal.left)}); left in place")


@contextlib.contextmanager
def locked(parent: int, name: str, timeout: float) -> Iterator[None]:
    """Hold an exclusive lock on ``parent/name`` (a lock file), waiting at most ``timeout``."""
    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                 dir_fd=parent)
    try:
        try:
            files.lock(fd, timeout, f"the archive lock {name}")
        except files.UnsafeFileError as exc:
            raise ArchiveError(str(exc)) from None
        yield
    finally:
        os.close(fd)


def _check_name(name: str) -> None:
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise ArchiveError(f"{name!r} is not a plain file name")


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)
