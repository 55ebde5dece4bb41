"""Unpack a tar (plain, gz, bz2, xz, zst) or zip archive into scratch, safely, as the user.

Runs in the user-side worker only: an archive is the user's data, so it is parsed with
the user's rights and nothing else (root never parses one). Even so every member is
checked: a name that is absolute or climbs with ``..`` is refused; folders are walked
from descriptors with no-follow opens, so a symlink member can never redirect a later
member out of DEST; devices and fifos are refused; set-id bits are dropped; a member that
would overrun the free space, or a zip entry that inflates past its declared size, stops
the unpack. Each file is verified like any staged file. zstd streams go through the
``zstd`` program (Python 3.11 has no zstd module), run as the user.
"""

from __future__ import annotations

import contextlib
import hashlib
import lzma
import os
import stat
import subprocess
import tarfile
import tempfile
import time
import zipfile
import zlib
from collections.abc import Iterator
from typing import IO

from wrapper.errors import UserInputError
from wrapper.osl.dirs import DirTree
from wrapper.staging.copy import BUFFER, Meter, TreeResult, write_error
from wrapper.staging.errors import StagingError
from wrapper.staging.report import format_bytes
from wrapper.staging.spec import member_path
from wrapper.staging.tree import sha256_fd

FORMATS = "tar, tar.gz, tar.bz2, tar.xz, tar.zst or zip"
_ZIP = (b"PK\x03\x04", b"PK\x05\x06")
_ZSTD = b"\x28\xb5\x2f\xfd"
_CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DAMAGED = (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError,
            NotImplementedError)


def unpack(src_fd: int, tree: DirTree, dest: str, *, label: str, verify: str, margin: int,
           meter: Meter | None = None, zstd_command: str = "zstd") -> TreeResult:
    """Unpack the archive open on ``src_fd`` into ``dest`` (relative to ``tree``)."""
    head = os.pread(src_fd, 512, 0)
    target = _Target(tree, dest, label=label, verify=verify, margin=margin, meter=meter)
    try:
        if head[:4] in _ZIP:
            with os.fdopen(os.dup(src_fd), "rb") as handle, zipfile.ZipFile(handle) as archive:
                _unpack_zip(archive, target)
        elif head[:4] == _ZSTD:
            with _zstd_stream(src_fd, zstd_command, label) as stream:
                _unpack_tar(stream, target)
        else:
            with os.fdopen(os.dup(src_fd), "rb", buffering=BUFFER) as stream:
                stream.seek(0)
                _unpack_tar(stream, target)
    except (UserInputError, StagingError):
        raise
    except _DAMAGED as exc:
        raise UserInputError(f"{label}: SRC is not a {FORMATS} archive, or it is damaged "
                             f"({type(exc).__name__}: {exc})") from None
    except OSError as exc:  # reading it (writes are translated where they happen)
        raise UserInputError(f"{label}: cannot read the archive ({exc})") from None
    target.finish()
    return target.result


class _Target:
    """Where members land: a DirTree below ``dest``, and the bookkeeping of an unpack."""

    def __init__(self, tree: DirTree, dest: str, *, label: str, verify: str, margin: int,
                 meter: Meter | None) -> None:
        self.tree = tree
        self.dest = dest
        self.label = label
        self.verify = verify
        self.meter = meter
        self.result = TreeResult()
        self.kinds: dict[str, str] = {}  # what this archive wrote, by path
        self.dir_meta: dict[str, tuple[int, int]] = {}
        info = os.fstatvfs(tree.get(dest))
        self.block = max(info.f_bsize, 512)
        self.room = info.f_bavail * info.f_frsize - margin
        self.margin = margin
        self.used = 0
        self.buffer = bytearray(BUFFER)

    def path(self, name: str) -> str:
        rel = member_path(name, where=self.label)
        return "/".join(p for p in (self.dest, rel) if p)

    def folder(self, name: str, mode: int, mtime: float) -> None:
        path = self.path(name)
        if path == self.dest:
            return  # the archive's "./": DEST itself
        self.tree.get(path)
        self.kinds[path] = "dir"
        self.dir_meta[path] = (mode & 0o777 | 0o700, round(mtime * 1e9))

    def file(self, name: str, size: int, mode: int, mtime: float, stream: IO[bytes]) -> None:
        path = self.path(name)
        self._reserve(path, size)
        parent_fd, leaf = self._slot(path)
        try:
            fd = os.open(leaf, _CREATE, 0o600, dir_fd=parent_fd)
        except OSError as exc:
            raise write_error(path, exc) from None
        try:
            hasher = hashlib.sha256() if self.verify == "sha256" else None
            view = memoryview(self.buffer)
            done = 0
            while True:
                count = stream.readinto(view)  # type: ignore[attr-defined]
                if not count:
                    break
                done += count
                if done > size:
                    raise UserInputError(f"{self.label}: member {name!r} holds more than its "
                                         f"declared {size} bytes; the archive is damaged")
                if hasher is not None:
                    hasher.update(view[:count])
                written = 0
                while written < count:
                    written += os.write(fd, view[written:count])
                if self.meter:
                    self.meter.add(nbytes=count)
            if done != size or os.fstat(fd).st_size != size:
                raise UserInputError(f"{self.label}: member {name!r} is shorter than its "
                                     f"declared {size} bytes; the archive is damaged")
            os.fchmod(fd, mode & 0o777)
            os.utime(fd, ns=(round(mtime * 1e9),) * 2)
            if hasher is not None:
                digest = hasher.hexdigest()
                if sha256_fd(fd) != digest:
                    raise StagingError(f"{path}: the unpacked copy does not match the "
                                       "archive (sha256)")
                self.result.checksums[path] = digest
        except BaseException as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(leaf, dir_fd=parent_fd)
            if isinstance(exc, OSError):
                raise write_error(path, exc) from None
            raise
        os.close(fd)
        self.kinds[path] = "file"
        self.result.files += 1
        self.result.bytes += size
        if self.meter:
            self.meter.add(files=1)

    def symlink(self, name: str, target: str, mtime: float) -> None:
        path = self.path(name)
        parent_fd, leaf = self._slot(path)
        try:
            os.symlink(target, leaf, dir_fd=parent_fd)
            os.utime(leaf, ns=(round(mtime * 1e9),) * 2, dir_fd=parent_fd,
                     follow_symlinks=False)
        except OSError as exc:
            raise write_error(path, exc) from None
        self.kinds[path] = "symlink"

    def hardlink(self, name: str, target_name: str) -> None:
        path = self.path(name)
        target = self.path(target_name)
        if self.kinds.get(target) != "file":
            raise UserInputError(f"{self.label}: member {name!r} is a hard link to "
                                 f"{target_name!r}, which is not a file unpacked before it")
        target_parent, _, target_leaf = target.rpartition("/")
        parent_fd, leaf = self._slot(path)
        try:
            os.link(target_leaf, leaf, src_dir_fd=self.tree.get(target_parent),
                    dst_dir_fd=parent_fd, follow_symlinks=False)
        except OSError as exc:
            raise write_error(path, exc) from None
        self.kinds[path] = "file"
        self.result.files += 1

    def finish(self) -> None:
        for path in sorted(self.dir_meta, key=lambda p: -p.count("/")):
            mode, mtime_ns = self.dir_meta[path]
            fd = self.tree.get(path)
            os.fchmod(fd, mode)
            os.utime(fd, ns=(mtime_ns, mtime_ns))

    def _slot(self, path: str) -> tuple[int, str]:
        """The parent folder's descriptor and the leaf name; a later member of the same
        archive replaces an earlier one (as tar does), anything else already there is an
        error."""
        if path == self.dest:
            raise UserInputError(f"{self.label}: a member names DEST itself")
        parent, _, leaf = path.rpartition("/")
        parent_fd = self.tree.get(parent)
        if self.kinds.get(path) in ("file", "symlink"):
            os.unlink(leaf, dir_fd=parent_fd)
            del self.kinds[path]
        elif self.kinds.get(path) == "dir":
            raise UserInputError(f"{self.label}: member {path!r} is both a folder and a file")
        return parent_fd, leaf

    def _reserve(self, path: str, size: int) -> None:
        self.used += -(-size // self.block) * self.block
        if self.used > self.room:
            reserve = f" and {format_bytes(self.margin)} must stay free" if self.margin \
                else ""
            raise UserInputError(
                f"{self.label}: the unpacked data does not fit: with {path!r} it needs "
                f"{format_bytes(self.used)} but only {format_bytes(self.room + self.margin)} "
                f"was free on the node's local disk{reserve}; stage less data, or ask for a "
                "node with more local disk")


def _unpack_tar(stream: IO[bytes], target: _Target) -> None:
    with tarfile.open(fileobj=stream, mode="r|*") as archive:
        for member in archive:
            name = member.name
            if member.isdir():
                target.folder(name, member.mode, member.mtime)
            elif member.isreg():
                data = archive.extractfile(member)
                if data is None:  # pragma: no cover - isreg members always have data
                    raise UserInputError(f"{target.label}: member {name!r} has no data")
                with data:
                    target.file(name, member.size, member.mode, member.mtime, data)
            elif member.issym():
                target.symlink(name, member.linkname, member.mtime)
            elif member.islnk():
                target.hardlink(name, member.linkname)
            else:
                raise UserInputError(f"{target.label}: member {name!r} is a device or fifo; "
                                     "only files, folders and links are unpacked")


def _unpack_zip(archive: zipfile.ZipFile, target: _Target) -> None:
    members = archive.infolist()
    if target.meter:
        target.meter.files_total = sum(1 for m in members if not m.is_dir())
        target.meter.bytes_total = sum(m.file_size for m in members)
    for member in members:
        unix = member.external_attr >> 16 if member.create_system == 3 else 0
        mtime = time.mktime((*member.date_time, 0, 0, -1))
        if member.is_dir():
            target.folder(member.filename, unix & 0o777 or 0o755, mtime)
        elif stat.S_ISLNK(unix):
            text = os.fsdecode(archive.read(member))
            target.symlink(member.filename, text, mtime)
        elif unix and not stat.S_ISREG(unix):
            raise UserInputError(f"{target.label}: member {member.filename!r} is a device or "
                                 "fifo; only files, folders and links are unpacked")
        else:
            with archive.open(member) as data:
                target.file(member.filename, member.file_size, unix & 0o777 or 0o644, mtime,
                            data)


@contextlib.contextmanager
def _zstd_stream(src_fd: int, command: str, label: str) -> Iterator[IO[bytes]]:
    source = os.dup(src_fd)
    os.lseek(source, 0, os.SEEK_SET)
    with tempfile.TemporaryFile() as errors:
        try:
            proc = subprocess.Popen([command, "-d", "-c", "-q"], stdin=source,
                                    stdout=subprocess.PIPE, stderr=errors, close_fds=True)
        except OSError as exc:
            os.close(source)
            raise StagingError(f"{label}: SRC is a zstd archive but {command!r} cannot run on "
                               f"this node ({exc.strerror}); install zstd or set "
                               "staging.zstd_command") from None
        os.close(source)
        stream = proc.stdout
        if stream is None:  # pragma: no cover - stdout=PIPE always gives one
            raise StagingError(f"{label}: zstd gave no output stream")
        try:
            yield stream
        finally:
            stream.close()
            try:
                code = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
        if code not in (0, -13):  # -13: SIGPIPE, we stopped reading after an error
            errors.seek(0)
            detail = errors.read().decode(errors="replace").strip().splitlines()
            raise UserInputError(f"{label}: SRC is not a valid zstd archive"
                                 f" ({detail[-1] if detail else f'zstd exit {code}'})")


__all__ = ["FORMATS", "unpack"]
