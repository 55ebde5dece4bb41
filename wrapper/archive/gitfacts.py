"""The git facts of a job's work dir, read from ``.git`` itself: no git is run.

Running ``git`` in a user's repository from a root hook runs the user's code: the
repository's ``core.fsmonitor``, its clean/smudge/process filters, its hooks, and any
program its config (or a config it includes) names. The hook would start it outside the
job's cgroup, where it can outlive the job. So nothing here runs anything: the commit
and branch come from ``HEAD``, the loose refs and ``packed-refs``; whether the work tree
is dirty comes from the index's stat data compared with ``lstat`` of each tracked file
(what git itself does before it would look at contents). That check is conservative: a
file rewritten with the same bytes counts as changed, and untracked files do not count.

Meant to run with the job user's rights (``wrapper.osl.child.call_as``): every file is
opened non-blocking, must be a regular file, and is read up to a bound.
"""

from __future__ import annotations

import os
import stat
import struct
from typing import Any

_SMALL = 64 << 10  # HEAD, a ref, a gitfile, commondir
_PACKED_MAX = 64 << 20
_INDEX_MAX = 512 << 20
_MAX_DEPTH = 64  # folders walked up looking for .git
_MAX_SYMREFS = 5
_HEX = frozenset("0123456789abcdef")


class GitReadError(Exception):
    """The repository could not be read; the message says what and why."""


def read_facts(work_dir: str) -> dict[str, Any]:
    """``{repository, commit, branch, dirty, changes}`` of the repository holding
    ``work_dir`` (``{"repository": False}`` when there is none). Raises GitReadError."""
    found = find_repository(work_dir)
    if found is None:
        return {"repository": False}
    top, git_dir = found
    common = _common_dir(git_dir)
    if os.path.isdir(os.path.join(common, "reftable")):
        raise GitReadError("the repository keeps its refs in a reftable, which jobwrap does "
                           "not read")
    head = _read_small(os.path.join(git_dir, "HEAD")).strip()
    branch: str | None = None
    commit: str | None
    if head.startswith("ref:"):
        ref = head[4:].strip()
        if ref.startswith("refs/heads/"):
            branch = ref[len("refs/heads/"):]
        commit = _resolve(git_dir, common, ref)
    else:
        commit = _object_id(head, "HEAD")
    facts: dict[str, Any] = {"repository": True, "commit": commit, "branch": branch}
    changes = changed_files(top, os.path.join(git_dir, "index"),
                            hash_bytes=len(commit) // 2 if commit else 20)
    if changes is not None:
        facts.update(dirty=changes > 0, changes=changes)
    return facts


def find_repository(work_dir: str) -> tuple[str, str] | None:
    """(work tree top, git dir) of the repository ``work_dir`` is in, else None."""
    here = os.path.abspath(work_dir)
    os.stat(here)  # a missing or unreadable work dir is an error, not "no repository"
    for _ in range(_MAX_DEPTH):
        candidate = os.path.join(here, ".git")
        try:
            info = os.stat(candidate)
        except (FileNotFoundError, NotADirectoryError):
            info = None
        if info is not None and stat.S_ISDIR(info.st_mode):
            if os.path.exists(os.path.join(candidate, "HEAD")):
                return here, candidate
        elif info is not None and stat.S_ISREG(info.st_mode):
            text = _read_small(candidate).strip()
            if text.startswith("gitdir:"):
                target = text[len("gitdir:"):].strip()
                return here, os.path.normpath(os.path.join(here, target))
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent
    return None


def _common_dir(git_dir: str) -> str:
    """Where a linked worktree's refs live (``commondir``), else the git dir itself."""
    try:
        text = _read_small(os.path.join(git_dir, "commondir")).strip()
    except FileNotFoundError:
        return git_dir
    return os.path.normpath(os.path.join(git_dir, text)) if text else git_dir


def _per_worktree(ref: str) -> bool:
    return ref == "HEAD" or ref.startswith(("refs/bisect/", "refs/worktree/", "refs/rewritten/"))


def _resolve(git_dir: str, common: str, ref: str) -> str | None:
    """The object id ``ref`` names (following symbolic refs), None for an unborn branch."""
    for _ in range(_MAX_SYMREFS):
        if not ref.startswith("refs/") or ".." in ref.split("/") or "\0" in ref:
            raise GitReadError(f"HEAD names {ref!r}, which is not a ref")
        try:
            text = _read_small(os.path.join(git_dir if _per_worktree(ref) else common,
                                            ref)).strip()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return _packed(common, ref)
        if not text.startswith("ref:"):
            return _object_id(text, ref)
        ref = text[4:].strip()
    raise GitReadError(f"symbolic refs nested more than {_MAX_SYMREFS} deep")


def _packed(common: str, ref: str) -> str | None:
    try:
        data = _read_regular(os.path.join(common, "packed-refs"), _PACKED_MAX)
    except FileNotFoundError:
        return None
    want = ref.encode("utf-8", "surrogateescape")
    for line in data.splitlines():
        if line[:1] in (b"#", b"^"):
            continue
        oid, _, name = line.partition(b" ")
        if name.strip() == want:
            return _object_id(oid.decode("ascii", "replace"), ref)
    return None


def _object_id(text: str, what: str) -> str:
    if len(text) not in (40, 64) or not set(text) <= _HEX:
        raise GitReadError(f"{what} does not hold an object id")
    return text


# -- the index --------------------------------------------------------------------------------
def changed_files(top: str, index_path: str, *, hash_bytes: int = 20) -> int | None:
    """How many tracked files differ from the index by type, mode, size or mtime (or are
    gone); None when the repository has no index yet."""
    try:
        data = _read_regular(index_path, _INDEX_MAX)
    except FileNotFoundError:
        return None
    changed: set[str] = set()
    for path, mode, mtime, size in _index_entries(data, hash_bytes):
        try:
            now = os.lstat(os.path.join(top, path))
        except (FileNotFoundError, NotADirectoryError):
            changed.add(path)
            continue
        if stat.S_IFMT(now.st_mode) != stat.S_IFMT(mode) or (
                stat.S_ISREG(mode) and (now.st_mode & 0o100) != (mode & 0o100)) \
                or now.st_size & 0xFFFFFFFF != size \
                or (now.st_mtime_ns // 1_000_000_000, now.st_mtime_ns % 1_000_000_000) != mtime:
            changed.add(path)
    return len(changed)


def _index_entries(data: bytes,
                   hash_bytes: int) -> list[tuple[str, int, tuple[int, int], int]]:
    """(path, mode, (mtime s, ns), size) of each work-tree entry of a git index."""
    if len(data) < 12 or data[:4] != b"DIRC":
        raise GitReadError("the index is not a git index")
    version, count = struct.unpack(">II", data[4:12])
    if version not in (2, 3, 4):
        raise GitReadError(f"index version {version} is not known")
    out: list[tuple[str, int, tuple[int, int], int]] = []
    pos, previous = 12, b""
    fixed = 40 + hash_bytes + 2
    try:
        for _ in range(count):
            start = pos
            (_cs, _cn, mtime_s, mtime_ns, _dev, _ino, mode, _uid, _gid,
             size) = struct.unpack(">10I", data[pos:pos + 40])
            flags = struct.unpack(">H", data[pos + 40 + hash_bytes:pos + fixed])[0]
            pos += fixed
            extended = 0
            if flags & 0x4000 and version >= 3:
                extended = struct.unpack(">H", data[pos:pos + 2])[0]
                pos += 2
            if version == 4:
                strip, pos = _varint(data, pos)
                end = data.index(b"\0", pos)
                if strip > len(previous):
                    raise GitReadError("the index is damaged")
                name = previous[:len(previous) - strip] + data[pos:end]
                pos = end + 1
            else:
                end = data.index(b"\0", pos)
                name = data[pos:end]
                pos = start + ((end - start) // 8 + 1) * 8  # 1 to 8 NULs pad each entry
            previous = name
            skip = flags & 0x8000 or extended & 0x4000  # assume-unchanged, skip-worktree
            if (flags >> 12) & 3 or extended & 0x2000:  # a conflict, an intent-to-add
                out.append((name.decode("utf-8", "surrogateescape"), 0, (-1, -1), -1))
            elif not skip and stat.S_IFMT(mode) in (stat.S_IFREG, stat.S_IFLNK):
                out.append((name.decode("utf-8", "surrogateescape"), mode,
                            (mtime_s, mtime_ns), size))
    except (struct.error, ValueError):
        raise GitReadError("the index is truncated or damaged") from None
    return out


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """git's offset varint (index v4 path prefixes)."""
    byte = data[pos]
    pos += 1
    value = byte & 0x7F
    while byte & 0x80:
        byte = data[pos]
        pos += 1
        value = ((value + 1) << 7) | (byte & 0x7F)
    return value, pos


# -- bounded, non-blocking reads ---------------------------------------------------------------
def _read_small(path: str) -> str:
    return _read_regular(path, _SMALL).decode("utf-8", "surrogateescape")


def _read_regular(path: str, limit: int) -> bytes:
    """A regular file's bytes (a fifo or device is refused, never waited on)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(info.st_mode):
            raise GitReadError(f"{path} is not a regular file")
        if info.st_size > limit:
            raise GitReadError(f"{path} is larger than {limit >> 20} MiB")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise GitReadError(f"{path} is larger than {limit >> 20} MiB")
        return data
    finally:
        os.close(fd)
