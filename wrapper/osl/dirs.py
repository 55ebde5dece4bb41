"""Folders reached through descriptors, one component at a time, never through a symlink:
the only way root touches a folder someone else can write, or one below it.

Opening ``a/b/c`` by path follows any symlink a user swapped in for ``b``; walking with
``openat(O_NOFOLLOW | O_DIRECTORY)`` from a descriptor we trust cannot be redirected,
and whatever is created, listed, summed, synced or removed is exactly what was meant.
A path that may lawfully pass through symlinks (the admin's configured root, or one the
user names and the user's own process opens) says so: ``open_dir(path, follow=True)``.

Errors are the kernel's (``OSError``); two are told apart as subclasses, so a caller
can put its own words on them: ``NotADirectory`` (a symlink or a file where a folder
was expected) and ``Unremovable`` (an entry ``remove_tree`` could not unlink).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import resource
import stat
import threading
from dataclasses import field
from pathlib import Path

from wrapper.errors import UserInputError
from wrapper.fastdataclass import dataclass

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FOLLOWING = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NOT_A_DIR = (errno.ELOOP, errno.ENOTDIR)


class NotADirectory(OSError):
    """A symlink or a file is where a folder was to be opened (``ELOOP``/``ENOTDIR``)."""


class Unremovable(OSError):
    """``remove_tree`` could not unlink an entry (``filename`` names it)."""


def open_dir(path: str | Path, *, dir_fd: int | None = None, follow: bool = False) -> int:
    """A folder's descriptor; its last component must not be a symlink (NotADirectory).

    ``follow=True`` only for a path that may go through symlinks by right: an admin's
    configured root, or a folder the job's user names, opened by the user's process.
    """
    try:
        return os.open(path, _FOLLOWING if follow else DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _NOT_A_DIR:
            raise NotADirectory(exc.errno, exc.strerror, exc.filename) from None
        raise


def make_dir(parent_fd: int, name: str, mode: int = 0o700) -> int:
    """Make ``name`` in ``parent_fd`` (``mode``; kept as it is when it exists) and open it
    no-follow. Its owner and mode are the caller's to check or set on the descriptor."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, mode, dir_fd=parent_fd)
    return open_dir(name, dir_fd=parent_fd)


def exists(parent_fd: int, name: str) -> bool:
    """Whether ``name`` is in ``parent_fd`` (a symlink counts; it is not followed)."""
    try:
        os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def entries(fd: int) -> list[os.DirEntry[str]]:
    """A directory's entries, read through its descriptor (never through a path)."""
    # scandir reads a duplicate and keeps ``fd`` for the entries' own stat calls
    with os.scandir(fd) as it:
        return list(it)


def tree_size(fd: int) -> int:
    """Bytes in the regular files below a directory; symlinks are not followed."""
    total = 0
    for entry in entries(fd):
        if entry.is_dir(follow_symlinks=False):
            child = open_dir(entry.name, dir_fd=fd)
            try:
                total += tree_size(child)
            finally:
                os.close(child)
        elif entry.is_file(follow_symlinks=False):
            total += entry.stat(follow_symlinks=False).st_size
    return total


def sync_tree(fd: int) -> None:
    """fsync every file and directory below (and including) a directory."""
    for entry in entries(fd):
        if entry.is_dir(follow_symlinks=False):
            child = open_dir(entry.name, dir_fd=fd)
            try:
                sync_tree(child)
            finally:
                os.close(child)
        elif entry.is_file(follow_symlinks=False):
            child = os.open(entry.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            try:
                os.fsync(child)
            finally:
                os.close(child)
    os.fsync(fd)


def first_missing(dir_fd: int, path: str) -> str:
    """The shortest prefix of ``path`` that does not exist yet ("" if all of it does)."""
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts)):
        prefix = "/".join(parts[:i + 1])
        try:
            os.stat(prefix, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return prefix
        except OSError:
            return ""
    return ""


def raise_fd_limit() -> None:
    """Let this process hold one descriptor per directory of a deep tree.

    The soft limit is often 1024 while the hard one is far higher; raising the soft
    limit up to the hard one needs no privilege.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1 << 20 if hard == resource.RLIM_INFINITY else min(hard, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


class DirTree:
    """The directories below one root descriptor, opened or created on demand.

    ``get("a/b")`` walks (and with ``create``, makes) each component with no-follow
    opens, and remembers the descriptor; ``made`` lists the folders it created, so a
    caller can hand them to the job user or remove them after a failure. The root
    descriptor stays the caller's to close.
    """

    def __init__(self, root_fd: int, *, create: bool = True, mode: int = 0o700) -> None:
        self.root_fd = root_fd
        self.create = create
        self.mode = mode
        self._fds: dict[str, int] = {"": root_fd}
        self._made: list[str] = []
        self._lock = threading.Lock()

    @property
    def made(self) -> list[str]:
        """Folders this tree created, parents before children."""
        return list(self._made)

    def get(self, rel: str) -> int:
        """The descriptor of directory ``rel`` ("" is the root)."""
        fd = self._fds.get(rel)  # the hot path (once per file): a dict read needs no lock
        if fd is not None:
            return fd
        with self._lock:
            return self._get(rel)

    def opened(self) -> list[tuple[str, int]]:
        """(relative path, descriptor) of every directory open so far, root included."""
        with self._lock:
            return list(self._fds.items())

    def close(self) -> None:
        with self._lock:
            for rel, fd in self._fds.items():
                if rel:
                    os.close(fd)
            self._fds = {"": self.root_fd}

    def _get(self, rel: str) -> int:
        fd = self._fds.get(rel)
        if fd is not None:
            return fd
        parent, _, name = rel.rpartition("/")
        parent_fd = self._get(parent)
        made = False
        if self.create:
            try:
                os.mkdir(name, self.mode, dir_fd=parent_fd)
                made = True
            except FileExistsError:
                pass
            except PermissionError:
                raise UserInputError(f"cannot make the folder {rel!r}: permission denied "
                                     "for the job's user") from None
        try:
            fd = open_dir(name, dir_fd=parent_fd)
        except NotADirectory:
            raise UserInputError(f"{rel!r} is in the way: it exists and is not a folder "
                                 "(or is a symlink)") from None
        self._fds[rel] = fd
        if made:
            self._made.append(rel)
        return fd


# -- removing a tree -------------------------------------------------------------------------


@dataclass
class Removal:
    """What removing a tree did; ``left`` holds what it would not touch (mount points)."""

    path: str
    existed: bool = True
    files: int = 0
    dirs: int = 0
    left: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.left


def remove_tree(parent_fd: int, name: str, *, display: str | None = None) -> Removal:
    """Remove ``name`` inside the folder ``parent_fd`` without following symlinks or
    crossing into another mount. Iterative: a deep tree costs descriptors, not stack.

    Every folder is opened from its parent's descriptor with ``O_NOFOLLOW``, every entry
    is unlinked relative to that descriptor, a symlink is only ever unlinked (whatever it
    points to), and a folder on another file system (``st_dev`` differs), listed as a
    mount point, or swapped for one while we looked, is left alone with its contents and
    named in ``left``. An entry that cannot be unlinked is ``Unremovable``; a name that
    is not there is no error (``existed`` False).
    """
    removal = Removal(display or name)
    try:
        info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        removal.existed = False
        return removal
    if not stat.S_ISDIR(info.st_mode):
        _unlink(parent_fd, name, removal)
        return removal
    raise_fd_limit()
    try:
        top = open_dir(name, dir_fd=parent_fd)
    except NotADirectory:  # swapped for a link or a file
        _unlink(parent_fd, name, removal)
        return removal
    except FileNotFoundError:  # removed meanwhile
        removal.existed = False
        return removal
    device = os.fstat(top).st_dev
    mounts = _mount_points_under(_real(parent_fd, name))
    # frames: (descriptor, name in parent, path shown, names still to visit)
    stack: list[tuple[int, str, str, list[str]]] = []
    _push(stack, top, name, "")
    try:
        while stack:
            fd, own, rel, pending = stack[-1]
            if pending:
                entry = pending.pop()
                _visit(stack, fd, entry, f"{rel}/{entry}" if rel else entry, device, mounts,
                       removal)
                continue
            stack.pop()
            os.close(fd)
            parent = stack[-1][0] if stack else parent_fd
            try:
                os.rmdir(own, dir_fd=parent)
                removal.dirs += 1
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EBUSY):
                    raise
                # something in it was left (a mount); already listed in removal.left
    finally:
        for fd, _, _, _ in stack:
            os.close(fd)
    return removal


def _visit(stack: list[tuple[int, str, str, list[str]]], fd: int, name: str, rel: str,
           device: int, mounts: set[str], removal: Removal) -> None:
    try:
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        _unlink(fd, name, removal)
        return
    if info.st_dev != device or rel in mounts:
        removal.left.append(rel)
        return
    try:
        child = open_dir(name, dir_fd=fd)
    except NotADirectory:  # swapped under us: unlink the link
        _unlink(fd, name, removal)
        return
    seen = os.fstat(child)
    if (seen.st_dev, seen.st_ino) != (info.st_dev, info.st_ino):  # swapped for a mount
        os.close(child)
        removal.left.append(rel)
        return
    _push(stack, child, name, rel)


def _push(stack: list[tuple[int, str, str, list[str]]], fd: int, name: str, rel: str) -> None:
    try:
        if os.geteuid() != 0 and os.fstat(fd).st_mode & 0o700 != 0o700:
            with contextlib.suppress(PermissionError):  # not ours: unlinks will say so
                os.fchmod(fd, 0o700)  # our own read-only folder (a dataset's): open it up
        names = os.listdir(fd)
    except BaseException:
        os.close(fd)
        raise
    stack.append((fd, name, rel, names))


def _unlink(fd: int, name: str, removal: Removal) -> None:
    try:
        os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise Unremovable(exc.errno, exc.strerror, name) from None
    removal.files += 1


def _real(parent_fd: int, name: str) -> str:
    with contextlib.suppress(OSError):
        return os.path.join(os.readlink(f"/proc/self/fd/{parent_fd}"), name)
    return ""


def _mount_points_under(top: str) -> set[str]:
    """Mount points strictly inside ``top`` (relative to it), from /proc/self/mountinfo.

    ``st_dev`` already stops at other file systems; this also catches a bind mount of
    the same file system, which ``st_dev`` cannot tell apart.
    """
    found: set[str] = set()
    if not top:
        return found
    prefix = top.rstrip("/") + "/"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                fields = line.split(" ")
                if len(fields) > 4:
                    point = _unescape(fields[4])
                    if point.startswith(prefix):
                        found.add(point[len(prefix):])
    except OSError:
        pass
    return found


def _unescape(text: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)
