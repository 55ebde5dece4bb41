"""What a dataset is: every file, folder and symlink of a source with its size, mode and
times, read with the user's rights (a SourceTree), and sent to root as plain data.

The walk opens each folder with ``O_NOFOLLOW`` from its parent's descriptor and lists
entries sorted by name, so the same tree always yields the same manifest (the cache key
depends on it). Special files (fifos, sockets, devices) are refused, never opened.
"""

from __future__ import annotations

import errno
import hashlib
import os
import resource
import stat
from typing import Any

from wrapper.errors import UserInputError
from wrapper.fastdataclass import dataclass
from wrapper.osl.dirs import DIR_FLAGS, DirTree
from wrapper.osl.files import FILE_READ_FLAGS
from wrapper.staging.errors import StagingError
from wrapper.staging.spec import MAX_NAME_BYTES

FILE, DIR, LINK = "file", "dir", "symlink"
_HASH_BUFFER = 4 << 20


@dataclass(frozen=True)
class Entry:
    """One item of a tree; ``path`` is relative to the tree's root ("" is the root)."""

    path: str
    kind: str
    size: int = 0
    mode: int = 0o644  # permission bits only
    mtime_ns: int = 0
    ctime_ns: int = 0
    target: str = ""  # what a symlink points to, kept as text, never followed
    sha256: str = ""  # with content-keyed caching only

    def to_wire(self) -> list[Any]:
        return [self.path, self.kind, self.size, self.mode, self.mtime_ns, self.ctime_ns,
                self.target, self.sha256]


@dataclass(frozen=True)
class Manifest:
    """A scanned source: a single file (one entry, path "") or a folder (its root first)."""

    source: str  # the real path scanned, as the user resolved it
    kind: str  # FILE or DIR
    entries: tuple[Entry, ...]

    @property
    def files(self) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if e.kind == FILE)

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries if e.kind == FILE)

    def disk_bytes(self, block: int) -> int:
        """Space the tree takes on a file system with this block size (a fair estimate)."""
        block = max(block, 512)
        total = 0
        for entry in self.entries:
            size = entry.size if entry.kind == FILE else block if entry.kind == DIR else 0
            total += -(-size // block) * block
        return total

    def to_wire(self) -> dict[str, Any]:
        return {"source": self.source, "kind": self.kind,
                "entries": [e.to_wire() for e in self.entries]}


def is_inner_path(path: str) -> bool:
    """True for a normalized relative path that cannot leave its tree ("a/b", not "../b")."""
    if not path or path.startswith("/") or "\0" in path:
        return False
    try:
        return all(part not in ("", ".", "..") and len(os.fsencode(part)) <= MAX_NAME_BYTES
                   for part in path.split("/"))
    except UnicodeEncodeError:  # a lone surrogate no file name decodes to: not a name
        return False


class SourceTree:
    """A source opened with the caller's rights: its manifest, and its files on demand.

    ``path`` is followed if it is a symlink (the user named it); nothing below it is.
    With ``prove_read`` every file is opened once during the scan, so a file the user
    may not read is refused before anything is copied (the cache needs that proof: it
    must never hand a user data they could not read themselves). Those descriptors are
    kept (up to ``KEEP_OPEN``) and ``open`` hands them out: a cache fill then copies the
    very inode the scan described, without a second open.
    """

    KEEP_OPEN = 65536

    def __init__(self, path: str, *, dir_fd: int | None = None, checksums: bool = False,
                 prove_read: bool = False, label: str = "SRC") -> None:
        self.label = label
        self.path = path
        try:
            # stat first: opening a device or a fifo can have effects (a tape rewinds)
            seen = os.stat(path, dir_fd=dir_fd)
            if not (stat.S_ISDIR(seen.st_mode) or stat.S_ISREG(seen.st_mode)):
                raise UserInputError(f"{label} {path!r} is {_kind_name(seen.st_mode)}; only "
                                     "files and folders are staged")
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError as exc:
            raise _unreadable(f"{label} {path!r}", exc) from None
        self.root_fd = fd
        self._dirs = DirTree(fd, create=False)
        self._kept: dict[str, int] = {}  # path -> the scan's own descriptor (prove_read)
        self._keep = _keepable() if prove_read else 0
        try:
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino) != (seen.st_dev, seen.st_ino):
                raise UserInputError(f"{label} {path!r} changed while it was being staged; "
                                     "stage data that is not being written")
            # The path of what was opened, from the descriptor: resolving ``path`` again
            # by name would race a symlink swapped meanwhile (the cache key names it).
            real = opened_path(fd, label, path) if dir_fd is None else path
            if stat.S_ISDIR(info.st_mode):
                self.manifest = self._scan_tree(real, info, checksums, prove_read)
            elif stat.S_ISREG(info.st_mode):
                digest = sha256_fd(fd) if checksums else ""
                self.manifest = Manifest(real, FILE, (_entry("", info, sha256=digest),))
            else:
                raise UserInputError(f"{label} {path!r} is {_kind_name(info.st_mode)}; only "
                                     "files and folders are staged")
        except BaseException:
            self._close_kept()
            os.close(fd)
            raise

    def open(self, entry: Entry) -> int:
        """A read descriptor of one file of the manifest (the caller closes it).

        Reached folder by folder with no-follow opens, as the scan did: a folder swapped
        for a symlink since the scan is refused, not followed. O_NONBLOCK: a fifo swapped
        in cannot hang us; the copy checks type, size, mtime and ctime of what it read
        against the scan.
        """
        if self.manifest.kind == FILE:
            return os.dup(self.root_fd)  # copies use explicit offsets, so sharing is fine
        kept = self._kept.pop(entry.path, None)
        if kept is not None:
            return kept  # the caller's now
        parent, _, name = entry.path.rpartition("/")
        try:
            parent_fd = self._dirs.get(parent)
        except UserInputError:
            raise UserInputError(f"{self.label} folder {parent!r} changed while it was being "
                                 "staged; stage data that is not being written") from None
        except OSError as exc:
            raise _unreadable(f"{self.label} folder {parent!r}", exc) from None
        try:
            return os.open(name, FILE_READ_FLAGS, dir_fd=parent_fd)
        except OSError as exc:
            raise _unreadable(f"{self.label} file {entry.path!r}", exc) from None

    def close(self) -> None:
        self._close_kept()
        self._dirs.close()
        os.close(self.root_fd)

    def _close_kept(self) -> None:
        kept, self._kept = self._kept, {}
        for fd in kept.values():
            os.close(fd)

    def __enter__(self) -> SourceTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _scan_tree(self, real: str, info: os.stat_result, checksums: bool,
                   prove_read: bool) -> Manifest:
        entries = [_entry("", info, kind=DIR)]
        # depth first, one descriptor per level: deep trees cost depth, not breadth
        stack: list[tuple[str, int, list[tuple[str, bool]]]] = [
            ("", os.dup(self.root_fd), [])]
        stack[0][2].extend(self._names(stack[0][1], ""))
        try:
            while stack:
                rel, fd, pending = stack[-1]
                if not pending:
                    os.close(fd)
                    stack.pop()
                    continue
                name, regular = pending.pop()
                path = f"{rel}/{name}" if rel else name
                if regular and (prove_read or checksums):
                    # the listing says a file: opened at once (no-follow, non-blocking), its
                    # kind proved by fstat, with no lstat before (a syscall a file saved)
                    proved = self._open_proof(fd, name, path, checksums)
                    if proved is None:
                        continue  # gone since the listing: it is not part of the dataset
                    if proved[0] is not None:
                        entries.append(_entry(path, proved[0], sha256=proved[1]))
                        continue
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue  # gone since the listing: it is not part of the dataset
                if stat.S_ISDIR(st.st_mode):
                    entries.append(_entry(path, st, kind=DIR))
                    try:
                        child = os.open(name, DIR_FLAGS, dir_fd=fd)
                    except OSError as exc:
                        raise _unreadable(f"{self.label} folder {path!r}", exc) from None
                    stack.append((path, child, []))
                    stack[-1][2].extend(self._names(child, path))
                elif stat.S_ISREG(st.st_mode):
                    if prove_read or checksums:
                        st, digest = self._read_proof(fd, name, path, checksums)
                        entries.append(_entry(path, st, sha256=digest))
                    else:
                        entries.append(_entry(path, st))
                elif stat.S_ISLNK(st.st_mode):
                    entries.append(_entry(path, st, kind=LINK,
                                          target=os.readlink(name, dir_fd=fd)))
                else:
                    raise UserInputError(f"{self.label} {path!r} is {_kind_name(st.st_mode)}; "
                                         "only files, folders and symlinks are staged")
        finally:
            for _, fd, _ in stack:
                os.close(fd)
        return Manifest(real, DIR, tuple(entries))

    def _names(self, fd: int, rel: str) -> list[tuple[str, bool]]:
        """The folder's names, each with whether its listing says a regular file (the
        file system's d_type: a hint, proved on open)."""
        try:
            with os.scandir(fd) as listing:
                names = [(e.name, e.is_file(follow_symlinks=False)) for e in listing]
        except OSError as exc:
            raise _unreadable(f"{self.label} folder {rel or self.path!r}", exc) from None
        return sorted(names, reverse=True)  # popped from the end: visited in name order

    def _open_proof(self, dir_fd: int, name: str, path: str, checksums: bool
                    ) -> tuple[os.stat_result | None, str] | None:
        """A listed file opened and proved regular: (its stat, its digest); (None, "")
        when it is not a regular file after all (the caller looks again); None when it is
        gone."""
        try:
            fd = os.open(name, FILE_READ_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError:
            return (None, "")  # the lstat path says what it is, or why it cannot be read
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
                return (None, "")
            digest = sha256_fd(fd) if checksums else ""
        except BaseException:
            os.close(fd)
            raise
        if len(self._kept) < self._keep:
            self._kept[path] = fd
        else:
            os.close(fd)
        return st, digest

    def _read_proof(self, dir_fd: int, name: str, path: str,
                    checksums: bool) -> tuple[os.stat_result, str]:
        try:
            fd = os.open(name, FILE_READ_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            raise _unreadable(f"{self.label} file {path!r}", exc) from None
        try:
            st = os.fstat(fd)
            digest = sha256_fd(fd) if checksums else ""
        except BaseException:
            os.close(fd)
            raise
        if stat.S_ISREG(st.st_mode) and len(self._kept) < self._keep:
            self._kept[path] = fd
        else:
            os.close(fd)
        return st, digest


def _keepable() -> int:
    """How many scanned files' descriptors a SourceTree may keep open: at most
    ``KEEP_OPEN``, and half of what the descriptor limit leaves."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return SourceTree.KEEP_OPEN
    return max(0, min(SourceTree.KEEP_OPEN, (soft - 1024) // 2))


def opened_path(fd: int, label: str = "SRC", path: str = "") -> str:
    """The absolute path the kernel knows an open descriptor by (/proc/self/fd)."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError as exc:
        raise StagingError(f"cannot tell the path of {label} {path!r}: {exc.strerror} "
                           "(is /proc mounted?)") from None
    if not real.startswith("/") or real.endswith(" (deleted)"):
        raise UserInputError(f"{label} {path!r} was moved or deleted while it was being "
                             "staged; stage data that is not being changed")
    return real


def _entry(path: str, st: os.stat_result, *, kind: str = FILE, target: str = "",
           sha256: str = "") -> Entry:
    return Entry(path=path, kind=kind, size=st.st_size if kind == FILE else 0,
                 mode=stat.S_IMODE(st.st_mode) & 0o777, mtime_ns=st.st_mtime_ns,
                 ctime_ns=st.st_ctime_ns, target=target, sha256=sha256)


def sha256_fd(fd: int) -> str:
    """The sha256 of a whole file, read by offset (the descriptor's position is untouched)."""
    digest = hashlib.sha256()
    buffer = bytearray(_HASH_BUFFER)
    view = memoryview(buffer)
    offset = 0
    while True:
        count = os.preadv(fd, [buffer], offset)
        if not count:
            return digest.hexdigest()
        digest.update(view[:count])
        offset += count


def _unreadable(what: str, exc: OSError) -> Exception:
    if exc.errno == errno.ENOENT:
        return UserInputError(f"{what} does not exist on this node")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return UserInputError(f"{what} cannot be read by the job's user (permission "
                              "denied); make it readable to them, or stage something else")
    if exc.errno == errno.ELOOP:
        return UserInputError(f"{what} was replaced by a symlink while it was being staged")
    if exc.errno == errno.ENOTDIR:
        return UserInputError(f"{what} does not exist (a part of its path is not a folder)")
    return StagingError(f"{what}: {exc.strerror}")


def _kind_name(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a fifo"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"
