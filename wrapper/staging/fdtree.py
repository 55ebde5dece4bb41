"""Directory trees reached through file descriptors, one component at a time, never
through a symlink: the only way staging code touches a folder someone else can write.

Opening ``a/b/c`` by path follows any symlink a user swapped in for ``b``; walking with
``openat(O_NOFOLLOW | O_DIRECTORY)`` from a descriptor we trust cannot be redirected,
and whatever it creates is created exactly where it was meant to be.
"""

from __future__ import annotations

import errno
import os
import resource
import threading
from pathlib import Path

from wrapper.errors import UserInputError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NOT_A_DIR = (errno.ELOOP, errno.ENOTDIR)


def open_dir(path: str | Path, *, dir_fd: int | None = None) -> int:
    """Open a directory; its last component must not be a symlink."""
    return os.open(path, DIR_FLAGS, dir_fd=dir_fd)


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
            fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
        except OSError as exc:
            if exc.errno in _NOT_A_DIR:
                raise UserInputError(f"{rel!r} is in the way: it exists and is not a folder "
                                     "(or is a symlink)") from None
            raise
        self._fds[rel] = fd
        if made:
            self._made.append(rel)
        return fd


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
