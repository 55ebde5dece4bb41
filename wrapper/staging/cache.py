"""The node cache: datasets staged once per node, then linked into each job's scratch.

Layout under ``<cache_root>`` (root's, mode 0700; nothing in it is reachable by a user)::

    cache.lock              held while space is reserved and entries are evicted
    locks/<key>             one flock per entry: shared to use it, exclusive to fill it
    entries/<key>/data      the dataset (a file, or a folder tree), read-only
    entries/<key>/reserved  bytes promised to a fill in progress
    entries/<key>/complete.json   the marker, written last: an entry without it is never
                            used, and is rebuilt; so is one whose marker's "v" is
                            newer than ``MARKER_FORMAT`` (docs/upgrades.md: a cache
                            entry is a miss, never an error)
    trash/                  entries being deleted

* Key: sha256 of the source's real path and of every file's path, size, mode, mtime and
  ctime (``cache_key = "stat"``; ctime cannot be set back by a user, so a file rewritten
  with its old mtime is still noticed), or of every file's content (``"sha256"``: the
  same data found anywhere is one entry).
* Two jobs staging the same dataset: the first takes the entry's lock exclusively and
  fills it; the second waits for the lock, finds the marker, and reuses the entry.
* Data is filled by root from descriptors the user-side worker opened (see
  privileges.py), synced (one ``syncfs``) before the marker is written, owned by root,
  files 0444 (0555 if executable) in 0555 folders. A hard link in a job's scratch shares that inode:
  root-owned, so the user can neither write it nor chmod it; the job can read, rename or
  unlink its link, never change the cache. Where the cache and scratch are different
  file systems (or with ``cache_link = "copy"``) the files are copied instead, and then
  belong to the user.
* The first job of a dataset pays one copy, not two walks: where its scratch would get
  hard links (same file system, ``cache_link = "hardlink"``), ``fill`` links each file
  into scratch right after copying it into the entry and checking it (``Placement``).
  The link is the same root-owned 0444 inode a later ``place`` links, taken by name from
  the entry root holds exclusively in its private folder, so the protection is the
  same; scratch folders stay root's, 0700, until full. The marker is still written only
  after the ``syncfs``; a fill that fails drops its entry and takes its links back out
  of scratch (ENOSPC then still falls back to the worker's own copy).
* A fill is pipelined: the worker sends descriptors in batches of one folder, the hook
  answers each on receipt (the worker opens the next meanwhile) and copies a folder's
  files in order on one thread, folders in parallel (``copy.copy_batches``).
* Least recently used entries (the marker's mtime is touched on every use) are evicted
  so the cache stays under its cap; an entry in use (its lock held) is never evicted. A
  dataset larger than the cap, or than the free space, is staged without the cache.
  Sizes are counted in the blocks the cache's file system allocates (a folder or a
  small file takes a whole block), and a fill that still finds the disk full or the
  quota used (ENOSPC, EDQUOT) is dropped and raises CacheFull: the site's problem, so
  the caller stages the data without the cache and never blames the job.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wrapper.errors import JobwrapError, UserInputError
from wrapper.fastdataclass import dataclass
from wrapper.osl.dirs import DirTree, first_missing, make_dir, open_dir
from wrapper.osl.files import owned_alone
from wrapper.staging.copy import (
    Copied,
    Meter,
    TreeResult,
    copy_batches,
    dest_path,
    finish_dirs,
    for_each_by_folder,
    keep_mode,
    make_dirs,
    make_links,
    sync_filesystem,
    write_error,
    write_file,
)
from wrapper.staging.errors import NoSpaceError, StagingError
from wrapper.staging.privileges import UserIds
from wrapper.staging.scratch import remove_tree
from wrapper.staging.tree import DIR, FILE, Entry, Manifest, sha256_fd

if TYPE_CHECKING:
    from wrapper.config import StagingConfig

GIB = 1 << 30
KEY_MODES = ("stat", "sha256")
LINK_MODES = ("hardlink", "copy")
MARKER = "complete.json"
# The marker's "v"; the key's own scheme is in its head (jobwrap-cache-1). 2: a marker
# may be written before its entry is on disk ("synced": false, with the boot it was
# written in); a jobwrap that reads only 1 takes such an entry as a miss.
MARKER_FORMAT = 2
UNSYNCED = "unsynced"  # <root>/unsynced/KEY: entries whose marker is not durable yet
RESERVED = "reserved"
DATA = "data"
_KEY = re.compile(r"^[0-9a-f]{64}$")
_FILE_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class CacheFull(StagingError):
    """The node cache ran out of disk space or quota while filling an entry (dropped)."""


@dataclass(frozen=True)
class CachedEntry:
    key: str
    bytes: int
    last_used: float
    complete: bool
    source: str = ""
    disk_bytes: int = 0  # the blocks it takes (what the cap counts)

    @property
    def held(self) -> int:
        return max(self.disk_bytes, self.bytes)


@dataclass
class Claim:
    """An entry held under its lock; ``hit`` when it was complete (or became so while we
    waited for another job filling it)."""

    key: str
    lock_fd: int
    hit: bool = False
    waited: float = 0.0
    marker: dict[str, Any] = field(default_factory=dict)


@dataclass
class Placement:
    """Where a fill also places the dataset (one pass): each file is hard-linked into
    ``dest`` in the job's scratch as soon as it is in the cache; ``result`` counts what
    was placed (paths in scratch), as ``Cache.place`` would have."""

    scratch_fd: int
    dest: str
    user: UserIds
    result: TreeResult = field(default_factory=TreeResult)


class Cache:
    """One node's cache; every method runs in the hook (root), never in the worker."""

    def __init__(self, root: Path, *, max_bytes: int, key_mode: str = "stat",
                 link: str = "hardlink", free_margin_bytes: int = 0) -> None:
        if key_mode not in KEY_MODES or link not in LINK_MODES:
            raise ValueError(f"cache key {key_mode!r} / link {link!r}")
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.key_mode = key_mode
        self.link = link
        self.free_margin_bytes = free_margin_bytes
        self._fds: dict[str, int] = {}

    @classmethod
    def from_config(cls, cache_root: str | Path, cfg: StagingConfig) -> Cache | None:
        """The cache the config asks for, or None when ``[staging] cache = false``."""
        if not cfg.cache:
            return None
        return cls(Path(cache_root), max_bytes=int(cfg.cache_max_gib * GIB),
                   key_mode=cfg.cache_key, link=cfg.cache_link,
                   free_margin_bytes=int(cfg.free_space_margin_gib * GIB))

    # -- keys and listing ---------------------------------------------------------------

    def key_for(self, manifest: Manifest) -> str:
        if self.key_mode == "sha256":
            rows: list[Any] = [[e.path, e.kind, e.size, e.mode, e.sha256 or e.target]
                               for e in manifest.entries]
            if any(e.kind == FILE and not e.sha256 for e in manifest.entries):
                raise StagingError("a content-keyed cache needs the files' checksums")
            head: list[Any] = ["jobwrap-cache-1", "sha256", manifest.kind]
        else:
            rows = [[e.path, e.kind, e.size, e.mode, e.mtime_ns, e.ctime_ns, e.target]
                    for e in manifest.entries]
            head = ["jobwrap-cache-1", "stat", manifest.source, manifest.kind]
        blob = json.dumps([*head, rows], separators=(",", ":")).encode("utf-8",
                                                                         "surrogateescape")
        return hashlib.sha256(blob).hexdigest()

    def entries(self) -> list[CachedEntry]:
        """Every entry, complete or not (for tests, ``jobwrap doctor`` and eviction)."""
        out = []
        entries_fd = self._dir("entries")
        for key in sorted(os.listdir(entries_fd)):
            if not _KEY.match(key):
                continue
            marker = self._read_marker(key)
            if marker is not None:
                with contextlib.suppress(OSError):
                    used = os.stat(f"{key}/{MARKER}", dir_fd=entries_fd,
                                   follow_symlinks=False).st_mtime
                    out.append(CachedEntry(key, int(marker.get("bytes", 0)), used, True,
                                           str(marker.get("source", "")),
                                           int(marker.get("disk_bytes", 0))))
                continue
            out.append(CachedEntry(key, self._reserved(key), 0.0, False))
        return out

    def usage(self) -> int:
        """Bytes (allocated blocks) held by complete entries."""
        return sum(e.held for e in self.entries() if e.complete)

    def disk_bytes(self, manifest: Manifest) -> int:
        """What ``manifest`` takes in the cache: whole blocks of its file system."""
        return manifest.disk_bytes(os.fstatvfs(self._dir("entries")).f_bsize)

    def needs_copy(self, scratch_fd: int) -> bool:
        """Whether placing into this scratch copies (so it needs room there)."""
        return self.link == "copy" or os.fstat(scratch_fd).st_dev != os.fstat(
            self._dir("entries")).st_dev

    # -- claiming, filling, placing -----------------------------------------------------

    @contextlib.contextmanager
    def claim(self, key: str, *, deadline: float | None = None) -> Iterator[Claim]:
        """Hold entry ``key``: shared when it is complete, else exclusive (to fill it)."""
        _check_key(key)
        started = time.monotonic()
        fd = self._lock(key, shared=True, deadline=deadline)
        marker = self._read_marker(key)
        if marker is None:
            # Not complete: take it exclusively. Another job may fill it meanwhile.
            os.close(fd)
            fd = self._lock(key, shared=False, deadline=deadline)
            marker = self._read_marker(key)
            if marker is None:
                self._discard_incomplete(key)
        claim = Claim(key, fd, hit=marker is not None, waited=time.monotonic() - started,
                      marker=marker or {})
        try:
            yield claim
        finally:
            os.close(fd)

    def reserve(self, claim: Claim, need: int, files: int = 0) -> bool:
        """Make room for a fill of ``need`` bytes (``disk_bytes``) in ``files`` inodes,
        evicting the least recently used entries; False when the dataset cannot be cached
        (larger than the cap, the free space or the free inodes, or the disk is full),
        and the caller stages it without the cache."""
        if need > self.max_bytes:
            return False
        try:
            return self._reserve(claim, need, files)
        except OSError as exc:
            if exc.errno in _NO_SPACE:
                return False
            raise

    def _reserve(self, claim: Claim, need: int, files: int) -> bool:
        with self._global_lock():
            self._empty_trash()
            others = [e for e in self.entries() if e.key != claim.key]
            usage = 0
            complete = []
            for entry in others:
                if entry.complete:
                    usage += entry.held
                    complete.append(entry)
                elif not self._remove_if_idle(entry.key):
                    usage += entry.held  # another job's fill in progress: its promise counts
            complete.sort(key=lambda e: e.last_used)
            for entry in complete:
                if usage + need <= self.max_bytes and self._free() >= need + \
                        self.free_margin_bytes:
                    break
                if self._remove_if_idle(entry.key):
                    usage -= entry.held
            self._empty_trash()
            if usage + need > self.max_bytes or self._free() < need + self.free_margin_bytes \
                    or not self._inodes_for(files):
                return False
            entries_fd = self._dir("entries")
            entry_fd = make_dir(entries_fd, claim.key, 0o700)
            try:
                _write_atomic(entry_fd, RESERVED, str(need).encode())
            finally:
                os.close(entry_fd)
        return True

    def fill(self, claim: Claim, manifest: Manifest,
             batches: Iterable[list[tuple[Entry, int]]], *, verify: str, parallel: int,
             meter: Meter | None = None, place: Placement | None = None) -> dict[str, str]:
        """Copy the dataset into the claimed entry from open source descriptors, then
        write the marker. Takes ownership of every descriptor in ``batches``. Returns
        the sha256 of each file when they were computed (path in the dataset -> hex).

        With ``place`` (the job's scratch on the cache's file system, ``link =
        "hardlink"``) each file is also linked into the job's scratch right after it is
        copied and checked, so the first job pays one copy, not a copy and a second walk;
        what a failed fill placed in scratch is removed again (so a full cache can fall
        back to a plain copy into the same place)."""
        try:
            return self._fill(claim, manifest, batches, verify=verify, parallel=parallel,
                              meter=meter, place=place)
        except (NoSpaceError, OSError) as exc:
            if isinstance(exc, OSError) and exc.errno not in _NO_SPACE:
                if place is not None:
                    self.drop(claim)
                raise
            self.drop(claim)
            raise CacheFull(f"the node cache {self.root} is full ({exc})") from None
        except BaseException:
            if place is not None:
                self.drop(claim)  # half a fill is useless; give its space back now
            raise

    def settle(self) -> int:
        """Make this boot's entries durable (the epilog, off the job's start path): one
        ``syncfs``, then each such marker says ``synced``; returns how many. An entry
        filled in an earlier boot and never settled is no entry (``_read_marker``)."""
        pending_fd = self._dir(UNSYNCED)
        keys = [k for k in os.listdir(pending_fd) if _KEY.match(k)]
        if not keys:
            return 0
        entries_fd = self._dir("entries")
        sync_filesystem(entries_fd)  # every fill before this call is on disk now
        settled = 0
        with self._global_lock():  # no eviction moves an entry while its marker is rewritten
            for key in keys:
                marker = self._read_marker(key)
                if marker is not None and marker.get("synced") is False:
                    entry_fd = open_dir(key, dir_fd=entries_fd)
                    try:
                        _write_atomic(entry_fd, MARKER, json.dumps(
                            {**marker, "synced": True}).encode(), mode=0o444)
                        os.fsync(entry_fd)
                    finally:
                        os.close(entry_fd)
                    settled += 1
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(key, dir_fd=pending_fd)
        return settled

    def drop(self, claim: Claim) -> None:
        """Remove the claimed entry's partial fill now, giving its space back."""
        with self._global_lock():
            self._discard_incomplete(claim.key)
            self._empty_trash()

    def _fill(self, claim: Claim, manifest: Manifest,
              batches: Iterable[list[tuple[Entry, int]]], *, verify: str, parallel: int,
              meter: Meter | None = None, place: Placement | None = None) -> dict[str, str]:
        if self.key_mode == "sha256":
            verify = "sha256"  # the key promises content: check the bytes against it
        target = _Target(place, manifest) if place is not None else None
        entry_fd = open_dir(claim.key, dir_fd=self._dir("entries"))
        tree = None
        try:
            if manifest.kind == DIR:
                data_fd = make_dir(entry_fd, DATA, 0o700)
                tree = DirTree(data_fd)
                dest = ""
            else:
                tree = DirTree(entry_fd)
                dest = DATA
            make_dirs(manifest, tree, dest)
            then = None
            if target is not None:
                target.make_dirs()
                then = partial(target.link, tree, dest)
            result = TreeResult()
            copy_batches(batches, tree, dest, result, verify=verify, parallel=parallel,
                         meter=meter, file_mode=_cached_mode, then=then)
            if result.files != len(manifest.files):
                raise StagingError(f"the cache fill got {result.files} of "
                                   f"{len(manifest.files)} files from the worker")
            make_links(manifest, tree, dest, result)
            finish_dirs(manifest, tree, dest, result, dir_mode=lambda e: 0o555)
            # Complete, but not durable yet: the page cache is what every reader of this
            # boot sees, so the entry serves this boot at once; the disk catches up in
            # the job's epilog (settle), and a boot that finds it unsynced refills it.
            if not boot_id():  # no boot to scope it to: durable before it says complete
                sync_filesystem(entry_fd)
            checksums = {_dataset_path(dest, p): h for p, h in result.checksums.items()}
            for entry in manifest.files:
                if entry.sha256 and checksums.get(entry.path) != entry.sha256:
                    raise StagingError(f"{entry.path!r} does not match the checksum it was "
                                       "keyed by; it changed while being staged")
            marker = {"v": MARKER_FORMAT, "key": claim.key, "source": manifest.source,
                      "kind": manifest.kind, "files": len(manifest.files),
                      "bytes": manifest.total_bytes,
                      "disk_bytes": self.disk_bytes(manifest), "created": time.time(),
                      "checksums": checksums, "boot": boot_id(), "synced": not boot_id()}
            if not marker["synced"]:
                _write_atomic(self._dir(UNSYNCED), claim.key, b"", durable=False)  # first
            _write_atomic(entry_fd, MARKER, json.dumps(marker).encode(), mode=0o444,
                          durable=bool(marker["synced"]))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(RESERVED, dir_fd=entry_fd)
            claim.marker = marker
            if target is not None:
                target.finish()
            return checksums
        except BaseException:
            if target is not None:
                target.undo()
            raise
        finally:
            if target is not None:
                target.close()
            if tree is not None:
                tree.close()
                if tree.root_fd != entry_fd:
                    os.close(tree.root_fd)
            os.close(entry_fd)

    def open_data(self, claim: Claim) -> int:
        """A read descriptor of a single-file entry (an archive to unpack)."""
        return os.open(f"{claim.key}/{DATA}", _FILE_READ, dir_fd=self._dir("entries"))

    def place(self, claim: Claim, manifest: Manifest, scratch_fd: int, dest: str,
              user: UserIds, *, verify: str, parallel: int,
              meter: Meter | None = None) -> TreeResult:
        """Link (or copy) a complete entry to ``dest`` inside the job's scratch.

        Root writes into the user's folder here, so only through descriptors: every
        folder is walked or made with no-follow opens, every name is new (O_EXCL, link),
        and the folders it makes stay root's, mode 0700, until they are full, then are
        handed to the user.
        """
        if not claim.marker:
            raise StagingError("placing a cache entry that is not complete")
        scratch = _Scratch(Placement(scratch_fd, dest, user), manifest)
        entry_fd = open_dir(claim.key, dir_fd=self._dir("entries"))
        cache_tree = DirTree(entry_fd, create=False)
        placing = _Placing(scratch, cache_tree, copy=self.link == "copy", verify=verify,
                           meter=meter, expected=claim.marker.get("checksums") or {})
        try:
            scratch.make_dirs()
            for_each_by_folder(manifest.files,
                               lambda e: dest_path(scratch.dest, e).rpartition("/")[0],
                               placing.place_one, parallel=parallel)
            scratch.finish()
            self._touch(claim.key)
        finally:
            scratch.close()
            cache_tree.close()
            os.close(entry_fd)
        return scratch.place.result

    # -- internals ------------------------------------------------------------------------

    def _dir(self, name: str) -> int:
        if not self._fds:
            self._open()
        return self._fds[name]

    def _open(self) -> None:
        """Open (making if needed) the cache's folders; they must be ours and private."""
        with contextlib.suppress(FileExistsError):
            os.makedirs(self.root.parent, 0o755, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.root, 0o700)
        try:
            root_fd = open_dir(self.root)
        except OSError as exc:
            raise StagingError(f"cannot open the cache {self.root}: {exc.strerror} (a "
                               "symlink? set paths.cache_root to the real folder)") from None
        info = os.fstat(root_fd)
        if not owned_alone(info, private=True):
            os.close(root_fd)
            raise StagingError(f"the cache {self.root} must be owned by uid {os.geteuid()} "
                               f"with mode 0700 (it is uid {info.st_uid}, mode "
                               f"{stat.S_IMODE(info.st_mode):04o})")
        fds = {"root": root_fd}
        for name in ("entries", "locks", "trash", UNSYNCED):
            fds[name] = make_dir(root_fd, name, 0o700)
        self._fds = fds

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def _lock(self, key: str, *, shared: bool, deadline: float | None) -> int:
        """flock the entry's lock file, waiting until ``deadline``; the file may be
        unlinked by an evictor between our open and our lock, so check it is still the
        one in place, else start over."""
        locks_fd = self._dir("locks")
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        pause = 0.005
        while True:
            fd = os.open(key, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=locks_fd)
            while True:
                try:
                    fcntl.flock(fd, mode | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if deadline is not None and time.monotonic() >= deadline:
                        os.close(fd)
                        raise StagingError("waited too long for another job that is caching "
                                           "the same dataset on this node") from None
                    time.sleep(pause)
                    pause = min(pause * 2, 0.2)
            try:
                current = os.stat(key, dir_fd=locks_fd, follow_symlinks=False)
            except FileNotFoundError:
                current = None
            if current is not None and current.st_ino == os.fstat(fd).st_ino:
                return fd
            os.close(fd)

    @contextlib.contextmanager
    def _global_lock(self) -> Iterator[None]:
        fd = os.open("cache.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=self._dir("root"))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read_marker(self, key: str) -> dict[str, Any] | None:
        try:
            fd = os.open(f"{key}/{MARKER}", _FILE_READ, dir_fd=self._dir("entries"))
        except OSError:
            return None
        try:
            with os.fdopen(fd, "rb") as handle:
                data = json.load(handle) if stat.S_ISREG(os.fstat(fd).st_mode) else None
        except ValueError:
            data = None
        if not isinstance(data, dict) or data.get("key") != key:
            return None
        version = data.get("v", 1)
        if not isinstance(version, int) or isinstance(version, bool) or \
                not 1 <= version <= MARKER_FORMAT:
            return None  # a newer jobwrap's entry: a miss here, filled again
        if data.get("synced") is False and data.get("boot") != boot_id():
            return None  # written before a reboot that may have lost its data: refilled
        return data

    def _reserved(self, key: str) -> int:
        try:
            fd = os.open(f"{key}/{RESERVED}", _FILE_READ, dir_fd=self._dir("entries"))
        except OSError:
            return 0
        try:
            return int(os.read(fd, 64) or b"0")
        except ValueError:
            return 0
        finally:
            os.close(fd)

    def _touch(self, key: str) -> None:
        with contextlib.suppress(OSError):
            os.utime(f"{key}/{MARKER}", dir_fd=self._dir("entries"), follow_symlinks=False)

    def _free(self) -> int:
        info = os.fstatvfs(self._dir("entries"))
        return info.f_bavail * info.f_frsize

    def _inodes_for(self, files: int) -> bool:
        info = os.fstatvfs(self._dir("entries"))
        return not info.f_files or info.f_favail > files + 16  # the entry's own files too

    def _discard_incomplete(self, key: str) -> None:
        """Move a half-filled entry (a crash, a failed fill) to the trash; we hold its lock."""
        entries_fd = self._dir("entries")
        try:
            os.rename(key, f"{key}.{os.urandom(4).hex()}", src_dir_fd=entries_fd,
                      dst_dir_fd=self._dir("trash"))
        except FileNotFoundError:
            return

    def _remove_if_idle(self, key: str) -> bool:
        """Remove an entry nobody holds (non-blocking); False if it is in use."""
        locks_fd = self._dir("locks")
        fd = os.open(key, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=locks_fd)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            self._discard_incomplete(key)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(key, dir_fd=locks_fd)  # waiters notice (inode check) and retry
            return True
        finally:
            os.close(fd)

    def _empty_trash(self) -> None:
        trash_fd = self._dir("trash")
        for name in os.listdir(trash_fd):
            remove_tree(trash_fd, name, display=f"{self.root}/trash/{name}")


class _Scratch:
    """Where a cache entry goes in the job's scratch: root's own writes into the user's
    folder, through descriptors (folders walked and made no-follow, every name new),
    the folders it makes root's and 0700 until full, then the user's."""

    def __init__(self, place: Placement, manifest: Manifest) -> None:
        if manifest.kind == FILE and place.dest in ("", "."):
            raise UserInputError("DEST '.' is the scratch folder itself; a file needs a name "
                                 "(--stage-in=SRC:NAME)")
        self.place = place
        self.manifest = manifest
        self.dest = "" if place.dest == "." else place.dest
        self.owner = (place.user.uid, place.user.gid)
        self.tree = DirTree(place.scratch_fd)

    def make_dirs(self) -> None:
        make_dirs(self.manifest, self.tree, self.dest)
        if self.manifest.kind == FILE:
            self.tree.get(self.dest.rpartition("/")[0])

    def finish(self) -> None:
        """The symlinks, then the folders' modes and times, and every folder to the user."""
        make_links(self.manifest, self.tree, self.dest, self.place.result, owner=self.owner)
        finish_dirs(self.manifest, self.tree, self.dest, self.place.result, owner=self.owner)
        dataset = {dest_path(self.dest, e) for e in self.manifest.entries if e.kind == DIR}
        for rel in self.tree.made:  # DEST's own parents made here: the user's too
            if rel not in dataset:
                os.fchown(self.tree.get(rel), *self.owner)

    def close(self) -> None:
        self.tree.close()


class _Placing:
    """The files of one ``Cache.place``: each hard-linked from the complete entry into
    scratch, or copied (``copy``, or from the first link that finds another file system
    on), checked against the entry's checksums, and counted."""

    def __init__(self, scratch: _Scratch, cache_tree: DirTree, *, copy: bool, verify: str,
                 meter: Meter | None, expected: dict[str, str]) -> None:
        self.scratch = scratch
        self.cache_tree = cache_tree
        self.copying = copy
        self.verify = verify
        self.meter = meter
        self.expected = expected  # path in the dataset -> the sha256 the fill recorded
        self.lock = threading.Lock()

    def place_one(self, entry: Entry) -> None:
        path = dest_path(self.scratch.dest, entry)
        parent, _, name = path.rpartition("/")
        parent_fd = self.scratch.tree.get(parent)
        cached = dest_path(DATA, entry) if self.scratch.manifest.kind == DIR else DATA
        cache_parent, _, cache_name = cached.rpartition("/")
        cache_fd = self.cache_tree.get(cache_parent)
        if not self.copying and self._link(entry, path, parent_fd, name, cache_fd, cache_name):
            return
        self._copy(entry, path, parent_fd, name, cache_fd, cache_name)

    def _link(self, entry: Entry, path: str, parent_fd: int, name: str, cache_fd: int,
              cache_name: str) -> bool:
        """Hard-link the cached file; False when scratch is on another file system after
        all (every file is copied from then on)."""
        try:
            os.link(cache_name, name, src_dir_fd=cache_fd, dst_dir_fd=parent_fd,
                    follow_symlinks=False)
        except FileExistsError:
            raise UserInputError(f"{path!r} already exists (do two directives stage "
                                 "to the same place?)") from None
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise write_error(path, exc) from None
            self.copying = True
            return False
        source = os.stat(cache_name, dir_fd=cache_fd, follow_symlinks=False)
        linked = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        if (linked.st_ino, linked.st_size) != (source.st_ino, entry.size):
            raise StagingError(f"{path}: the link does not match the cache entry")
        self._count(path, entry.size, self._check_sum(cache_fd, cache_name, entry))
        return True

    def _copy(self, entry: Entry, path: str, parent_fd: int, name: str, cache_fd: int,
              cache_name: str) -> None:
        """Copy the cached file: the user's own, checked against the recorded sum."""
        src = os.open(cache_name, _FILE_READ, dir_fd=cache_fd)
        try:
            copied = write_file(src, entry, parent_fd, name, label=path,
                                mode=keep_mode(entry), verify=self.verify,
                                owner=self.scratch.owner, same_inode=False)
        finally:
            os.close(src)
        want = self.expected.get(entry.path)
        if copied.sha256 and want and copied.sha256 != want:
            raise StagingError(f"{path}: the cache entry no longer matches its checksum")
        self._count(path, copied.bytes, copied.sha256)

    def _check_sum(self, parent_fd: int, name: str, entry: Entry) -> str:
        if self.verify != "sha256":
            return ""
        fd = os.open(name, _FILE_READ, dir_fd=parent_fd)
        try:
            digest = sha256_fd(fd)
        finally:
            os.close(fd)
        want = self.expected.get(entry.path)
        if want and want != digest:
            raise StagingError(f"{entry.path!r}: the cache entry no longer matches its "
                               "checksum (disk corruption?); it will be rebuilt")
        return digest

    def _count(self, path: str, size: int, digest: str) -> None:
        with self.lock:
            self.scratch.place.result.add(path, size, digest)
        if self.meter:
            self.meter.add(files=1, nbytes=size)


class _Target(_Scratch):
    """The scratch side of a one-pass fill: root's links into the job's scratch, made
    as ``Cache.place`` makes them, and taken back if the fill fails."""

    def __init__(self, place: Placement, manifest: Manifest) -> None:
        super().__init__(place, manifest)
        # what to remove on failure: the first part of DEST that is not there yet
        self.created = first_missing(place.scratch_fd, self.dest)
        self.lock = threading.Lock()
        self.linked: list[str] = []  # names linked straight into a folder that was there

    def link(self, cache_tree: DirTree, cache_dest: str, entry: Entry, copied: Copied) -> None:
        """Link the file just copied into the cache (and checked) into scratch. The name
        is taken in root's private, locked entry, so it is the inode just written."""
        cache_parent, _, cache_name = dest_path(cache_dest, entry).rpartition("/")
        path = dest_path(self.dest, entry)
        parent, _, name = path.rpartition("/")
        try:
            os.link(cache_name, name, src_dir_fd=cache_tree.get(cache_parent),
                    dst_dir_fd=self.tree.get(parent), follow_symlinks=False)
        except OSError as exc:
            raise write_error(path, exc) from None
        with self.lock:
            if not self.created:
                self.linked.append(path)
            self.place.result.add(path, copied.bytes, copied.sha256)

    def undo(self) -> None:
        """Remove what this fill placed: the folder it started DEST with, or else each
        top-level name it linked or made inside a DEST that was there before."""
        with contextlib.suppress(OSError, JobwrapError):
            if self.created:
                parent, _, leaf = self.created.rpartition("/")
                lookup = DirTree(self.place.scratch_fd, create=False)
                try:
                    remove_tree(lookup.get(parent), leaf)
                finally:
                    lookup.close()
                return
            made = set(self.tree.made)

            def in_made(path: str) -> bool:
                parent = path.rpartition("/")[0]
                while parent:
                    if parent in made:
                        return True
                    parent = parent.rpartition("/")[0]
                return False

            for path in [*sorted(made), *self.linked]:
                if not in_made(path):  # whatever is inside goes with its folder
                    parent, _, leaf = path.rpartition("/")
                    remove_tree(self.tree.get(parent), leaf)


def _cached_mode(entry: Entry) -> int:
    return 0o555 if entry.mode & 0o111 else 0o444


def _dataset_path(dest: str, path: str) -> str:
    return path[len(dest) + 1:] if dest and path.startswith(dest + "/") else \
        "" if path == dest else path


def _check_key(key: str) -> None:
    if not _KEY.match(key):
        raise StagingError(f"{key!r} is not a cache key")


def _write_atomic(dir_fd: int, name: str, data: bytes, *, mode: int = 0o600,
                  durable: bool = True) -> None:
    temp = f".{name}.{os.urandom(4).hex()}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


_boot: list[str] = []


def boot_id() -> str:
    """This boot's id (the kernel's, new at every boot); "" where there is none."""
    if not _boot:
        try:
            with open("/proc/sys/kernel/random/boot_id", "rb") as handle:
                _boot.append(handle.read(64).decode("ascii", "replace").strip())
        except OSError:
            _boot.append("")
    return _boot[0]


