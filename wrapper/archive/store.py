"""The archive on disk: ``<archive_root>/<user>/<jobid>/``, written so that it is never half there.

Layout of one job's archive::

    <archive_root>/<user>/<jobid>/manifest.json
    <archive_root>/<user>/<jobid>/attempt-<N>/<node>/part.json     what this part holds
    <archive_root>/<user>/<jobid>/attempt-<N>/<node>/verdicts.json root's verdicts in it
    <archive_root>/<user>/<jobid>/attempt-<N>/<node>/stdout.gz ...  its files

How it is written: each epilog builds its parts (an attempt on a node) in a temporary
sibling, ``<archive_root>/<user>/.<jobid>.<node>.<pid>.<random>.tmp``, and fsyncs them.
Then, holding the job's lock (``.<jobid>.lock`` beside it; the nodes of a multi-node job
archive at the same time): when the job has no archive yet, the manifest is written into
the temporary folder, which is renamed into place whole; otherwise each part is renamed
into the job's folder and the manifest rewritten (write, fsync, rename). A part that
replaces an earlier copy of itself is first dropped from the manifest, so the manifest
never names a part that is not all there. An epilog killed at any point leaves either
nothing that looks complete (a dot-named temporary folder, or a part the manifest does
not list yet) or the previous, consistent archive; the next epilog on that node removes
its dead temporaries and finishes the job (``wrapper.archive.attempt`` archives any
earlier attempt of its node that has no part).

Who may read it (``[archive] access``): ``user`` (the default), root and ``[archive]
admin_group`` own it and the job's user alone reads it through a POSIX ACL entry
(folders 0750, files 0640, so no one sharing the user's primary group reads it);
``group``, root owns everything and the job user's whole primary group reads it
(folders 0750 root:<user's group>, files 0640): only for sites where no two users share
a primary group (``jobwrap doctor`` warns otherwise). The root folder is 0751 (0711 with
``group``): users reach their own folder by name and cannot list anyone else's. Nothing
below the root is ever reached through a symlink (``wrapper.archive._fs``).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from wrapper.archive._fs import (
    Access,
    ArchiveError,
    entries,
    exists,
    locked,
    make_dir,
    make_temp_dir,
    open_dir,
    open_root,
    read_json,
    remove_tree,
    sync_tree,
    tree_size,
    write_json_atomic,
)
from wrapper.archive.info import ArchiveInfo, info_of
from wrapper.archive.manifest import MANIFEST, SCHEMA_VERSION
from wrapper.archive.parts import (
    _ATTEMPT,
    _JOB_ID,
    PART,
    PART_FORMAT,
    check_job_id,
    check_name,
    find_job,
    read_parts,
    users,
)
from wrapper.archive.spool import spool
from wrapper.errors import format_of
from wrapper.fastdataclass import dataclass
from wrapper.osl import dirs

STALE_TEMP_S = 86400.0  # a temporary folder this old is an epilog that died
MTIME_SLACK_S = 3600.0  # clocks of the nodes and the archive's file server may differ

__all__ = [
    "ArchiveError",
    "Removal",
    "Writer",
    "extract",
    "list_archives",
    "load_manifest",
    "prune",
    "scan",
]


def attempt_dir(attempt: int) -> str:
    return f"attempt-{attempt}"


# -- writing ------------------------------------------------------------------------------
class Writer:
    """Adds parts (an attempt on a node) to one job's archive; a context manager."""

    def __init__(self, root: str, user: str, job_id: str, node: str, access: Access, *,
                 root_mode: int = 0o711, root_gid: int = 0, lock_timeout: float = 30.0) -> None:
        self.root = root
        self.user = check_name("user", user)
        self.job_id = check_job_id(job_id)
        self.node = check_name("node", node)
        self.access = access
        self.root_mode, self.root_gid = root_mode, root_gid
        self.lock_timeout = lock_timeout
        self._fds: list[int] = []
        self.root_fd = -1
        self.user_fd = -1
        self.tmp_fd = -1
        self.tmp_name: str | None = None

    @property
    def path(self) -> str:
        return os.path.join(self.root, self.user, self.job_id)

    def __enter__(self) -> Writer:
        try:
            self.root_fd = self._keep(open_root(self.root, create=True, mode=self.root_mode,
                                                gid=self.root_gid))
            self.user_fd = self._keep(make_dir(self.root_fd, self.user, self.access))
            self._remove_dead_temporaries()
            prefix = f".{self.job_id}.{self.node}.{os.getpid()}."
            self.tmp_name = make_temp_dir(self.user_fd, prefix, self.access)
            self.tmp_fd = self._keep(open_dir(self.user_fd, self.tmp_name))
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.tmp_name is not None:  # not committed: nothing of it may stay
                with contextlib.suppress(OSError):
                    remove_tree(self.user_fd, self.tmp_name)
        finally:
            self._close()

    def has_part(self, attempt: int, node: str) -> bool:
        """Whether the job's archive already holds this part."""
        try:
            job_fd = open_dir(self.user_fd, self.job_id)
        except FileNotFoundError:
            return False
        try:
            return exists(job_fd, attempt_dir(attempt)) and _has(job_fd, attempt_dir(attempt),
                                                                 node)
        finally:
            os.close(job_fd)

    def part_dir(self, attempt: int) -> int:
        """The folder to collect this node's files of ``attempt`` into (temporary until commit)."""
        attempt_fd = self._keep(make_dir(self.tmp_fd, attempt_dir(attempt), self.access))
        return self._keep(make_dir(attempt_fd, self.node, self.access))

    def write_part(self, attempt: int, part: dict[str, Any]) -> None:
        fd = self.part_dir(attempt)
        write_json_atomic(fd, PART, {"format": PART_FORMAT, **part, "attempt": attempt,
                                     "node": self.node}, self.access)

    def commit(self, build_manifest: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> str:
        """Put this writer's parts in place and rewrite the manifest; returns the job's folder."""
        if self.tmp_name is None:
            raise ArchiveError("nothing to commit: this writer has already committed")
        sync_tree(self.tmp_fd)
        written: list[dict[str, Any]] = []

        def build(parts: list[dict[str, Any]]) -> dict[str, Any]:
            written.append(build_manifest(parts))
            return written[-1]

        with locked(self.user_fd, f".{self.job_id}.lock", self.lock_timeout):
            if not exists(self.user_fd, self.job_id):
                write_json_atomic(self.tmp_fd, MANIFEST, build(read_parts(self.tmp_fd, self.path)),
                                  self.access)
                os.rename(self.tmp_name, self.job_id, src_dir_fd=self.user_fd,
                          dst_dir_fd=self.user_fd)
                os.fsync(self.user_fd)
                self.tmp_name = None
            else:
                job_fd = self._keep(open_dir(self.user_fd, self.job_id))
                self._merge(job_fd, build)
        self._spool(written[-1])
        return self.path

    def _spool(self, manifest: dict[str, Any]) -> None:
        """The job's record into the index's spool; a failure is logged, never raised:
        the manifest is in place and ``jobwrap archive reindex`` finds the job again."""
        try:
            spool(self.root, self.root_fd, self.user, self.job_id, manifest)
        except (OSError, ArchiveError, ValueError, TypeError) as exc:
            from wrapper import log

            log.get().warning("archive.index_spool_failed", job_id=self.job_id,
                              error=str(exc), fix="jobwrap archive reindex")

    def _merge(self, job_fd: int, build_manifest: Callable[[list[dict[str, Any]]],
                                                           dict[str, Any]]) -> None:
        for entry in entries(job_fd):
            if entry.name.startswith(".trash."):  # a merge that died: we hold the lock now
                remove_tree(job_fd, entry.name)
        new = [(int(m.group(1)), entry.name) for entry in entries(self.tmp_fd)
               if (m := _ATTEMPT.match(entry.name))]
        replaced = {a for a, name in new if exists(job_fd, name) and _has(job_fd, name,
                                                                          self.node)}
        if replaced:
            # The manifest must not name a part while it is being swapped.
            kept = [p for p in read_parts(job_fd, self.path) if not (p.get("attempt") in replaced
                                                          and p.get("node") == self.node)]
            write_json_atomic(job_fd, MANIFEST, build_manifest(kept), self.access)
        trash: list[str] = []
        for attempt, name in sorted(new):
            src_fd = self._keep(open_dir(self.tmp_fd, name))
            dst_fd = self._keep(make_dir(job_fd, name, self.access))
            if attempt in replaced:
                trash.append(f".trash.{self.node}.{attempt}.{os.getpid()}")
                os.rename(self.node, trash[-1], src_dir_fd=dst_fd, dst_dir_fd=job_fd)
            os.rename(self.node, self.node, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            os.fsync(dst_fd)
        os.fsync(job_fd)
        write_json_atomic(job_fd, MANIFEST, build_manifest(read_parts(job_fd, self.path)),
                          self.access)
        for name in trash:
            remove_tree(job_fd, name)
        if self.tmp_name is not None:
            remove_tree(self.user_fd, self.tmp_name)
            self.tmp_name = None

    def _remove_dead_temporaries(self) -> None:
        """This node's temporaries of this job whose epilog is gone (killed mid-archive)."""
        prefix = f".{self.job_id}.{self.node}."
        for entry in entries(self.user_fd):
            if not (entry.name.startswith(prefix) and entry.name.endswith(".tmp")):
                continue
            pid_text = entry.name[len(prefix):].split(".", 1)[0]
            if pid_text.isdigit() and _alive(int(pid_text)):
                continue
            remove_tree(self.user_fd, entry.name)

    def _keep(self, fd: int) -> int:
        self._fds.append(fd)
        return fd

    def _close(self) -> None:
        for fd in reversed(self._fds):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()


def _has(job_fd: int, attempt_name: str, node: str) -> bool:
    attempt_fd = open_dir(job_fd, attempt_name)
    try:
        return exists(attempt_fd, node)
    finally:
        os.close(attempt_fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- reading ------------------------------------------------------------------------------
def list_archives(root: str, user: str | None = None,
                  since: float | None = None) -> list[ArchiveInfo]:
    """The archives under ``root`` (one user's, or every one the caller may read), oldest first.

    ``since``: only those updated at or after it (seconds since the epoch).
    """
    return sorted((info for info, _ in scan(root, user, since)),
                  key=lambda i: (i.updated_at, i.job_id))


def scan(root: str, user: str | None = None, since: float | None = None, *,
         sized: bool = True) -> Iterator[tuple[ArchiveInfo, dict[str, Any] | None]]:
    """Each archive the caller may read and its manifest (None: it does not parse), each
    manifest parsed once. With ``since``, a job folder last changed before it (less
    ``MTIME_SLACK_S`` for clocks apart) is passed over without opening anything in it: the
    manifest is written into its folder after its ``updated_at`` is taken. ``sized``:
    walk each job's folder for its size (0 when not)."""
    if not os.path.isdir(root):
        return  # nothing archived yet
    root_fd = open_root(root, create=False)
    try:
        for user_name in users(root_fd, user):
            try:
                user_fd = open_dir(root_fd, user_name)
            except (PermissionError, FileNotFoundError):
                continue
            try:
                found = [e for e in entries(user_fd) if _JOB_ID.match(e.name)
                         and e.is_dir(follow_symlinks=False) and (
                             since is None or e.stat(follow_symlinks=False).st_mtime
                             >= since - MTIME_SLACK_S)]
            except PermissionError:
                found = []
            try:
                for entry in found:
                    read = _read(root, user_fd, user_name, entry.name, sized)
                    if read is not None and (since is None or read[0].updated_at >= since):
                        yield read
            finally:
                os.close(user_fd)
    finally:
        os.close(root_fd)


def load_manifest(root: str, job_id: str, user: str | None = None) -> dict[str, Any]:
    """The manifest of a job's archive; ArchiveError when there is none the caller can read,
    FormatTooNew when a newer jobwrap wrote it (its ``schema_version``)."""
    root_fd = open_root(root, create=False)
    try:
        owner, job_fd = find_job(root_fd, check_job_id(job_id), user)
        try:
            manifest = read_json(job_fd, MANIFEST)
        finally:
            os.close(job_fd)
    finally:
        os.close(root_fd)
    if manifest is None:
        raise ArchiveError(f"the archive of job {job_id} has no readable {MANIFEST}")
    format_of(manifest, "schema_version", known=SCHEMA_VERSION, what="manifest",
              path=os.path.join(root, owner, job_id, MANIFEST))
    return manifest


def extract(root: str, job_id: str, dest: str, user: str | None = None) -> list[str]:
    """Copy a job's archive into ``dest``, decompressing ``.gz`` files; returns what it wrote.

    Refuses to overwrite anything: when one of the files exists in ``dest``, nothing is
    written. Nothing is created through a symlink inside ``dest``.
    """
    root_fd = open_root(root, create=False)
    try:
        _, job_fd = find_job(root_fd, check_job_id(job_id), user)
    finally:
        os.close(root_fd)
    try:
        plan = _plan(job_fd, ())
        clashes = [os.path.join(dest, *target) for _, target in plan
                   if os.path.lexists(os.path.join(dest, *target))]
        if clashes:
            raise ArchiveError(f"{clashes[0]} exists; extract never overwrites (choose an "
                               "empty or new folder)")
        os.makedirs(dest, 0o750, exist_ok=True)
        dest_fd = dirs.open_dir(dest, follow=True)  # the caller's own folder, as they name it
        written = []
        try:
            for source, target in plan:
                _extract_one(job_fd, source, dest_fd, target)
                written.append(os.path.join(dest, *target))
        finally:
            os.close(dest_fd)
    finally:
        os.close(job_fd)
    return written


def _plan(fd: int, prefix: tuple[str, ...]) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(source, target) relative paths of every file to extract, in a stable order."""
    plan = []
    for entry in sorted(entries(fd), key=lambda e: e.name):
        if entry.name.startswith("."):
            continue  # temporaries, locks, trash
        if entry.is_dir(follow_symlinks=False):
            child = open_dir(fd, entry.name)
            try:
                plan.extend(_plan(child, (*prefix, entry.name)))
            finally:
                os.close(child)
        elif entry.is_file(follow_symlinks=False):
            target = entry.name[:-3] if entry.name.endswith(".gz") else entry.name
            plan.append(((*prefix, entry.name), (*prefix, target)))
    return plan


def _extract_one(job_fd: int, source: tuple[str, ...], dest_fd: int,
                 target: tuple[str, ...]) -> None:
    src_dir, dst_dir = job_fd, dest_fd
    opened: list[int] = []
    try:
        for name in source[:-1]:
            src_dir = open_dir(src_dir, name)
            opened.append(src_dir)
        for name in target[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o750, dir_fd=dst_dir)
            dst_dir = dirs.open_dir(name, dir_fd=dst_dir)
            opened.append(dst_dir)
        src = os.open(source[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=src_dir)
        with os.fdopen(src, "rb") as raw:
            dst = os.open(target[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                          | os.O_CLOEXEC, 0o640, dir_fd=dst_dir)
            with os.fdopen(dst, "wb") as out:
                if source[-1].endswith(".gz"):
                    with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
                        shutil.copyfileobj(unzipped, out, 1 << 20)
                else:
                    shutil.copyfileobj(raw, out, 1 << 20)
    finally:
        for fd in reversed(opened):
            os.close(fd)


def _read(root: str, user_fd: int, user: str, job_id: str,
          sized: bool) -> tuple[ArchiveInfo, dict[str, Any] | None] | None:
    try:
        job_fd = open_dir(user_fd, job_id)
    except (PermissionError, FileNotFoundError):
        return None
    try:
        manifest = read_json(job_fd, MANIFEST)
        size = tree_size(job_fd) if sized else 0
        mtime = os.fstat(job_fd).st_mtime
    finally:
        os.close(job_fd)
    return info_of(root, user, job_id, manifest or {}, size, mtime), manifest


# -- retention ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Removal:
    info: ArchiveInfo
    reason: str  # "age" or "size"

    def as_dict(self) -> dict[str, Any]:
        return {**self.info.as_dict(), "reason": self.reason}


def prune(root: str, max_age_days: float, max_total_bytes: int, now: float, *,
          dry_run: bool = False, archives: Iterable[ArchiveInfo] | None = None,
          total: int | None = None) -> list[Removal]:
    """Remove whole job archives, oldest first: those older than ``max_age_days``, then
    more until the rest fit in ``max_total_bytes``. A limit of 0 is no limit. An archive
    that an epilog is writing right now (its lock is held) is left for the next prune.
    ``archives``: every archive, oldest first, as the index streams them, and ``total``
    their size (needed with a size limit); else the archive is walked. Reading stops at
    the first archive that stays: what is removed is the oldest prefix.
    """
    if archives is None:
        archives = list_archives(root)
        total = sum(i.size for i in archives)
    remaining = total or 0
    removals: list[Removal] = []
    for info in archives:
        if max_age_days > 0 and now - info.updated_at > max_age_days * 86400:
            removals.append(Removal(info, "age"))
        elif 0 < max_total_bytes < remaining:
            removals.append(Removal(info, "size"))
        else:
            break
        remaining -= info.size
    if dry_run:
        return removals
    done = []
    root_fd = open_root(root, create=False)
    try:
        for removal in removals:
            if _remove_job(root_fd, removal.info):
                done.append(removal)
        _remove_stale_temporaries(root_fd, now)
    finally:
        os.close(root_fd)
    return done


def _remove_job(root_fd: int, info: ArchiveInfo) -> bool:
    user_fd = open_dir(root_fd, info.user)
    try:
        try:
            with locked(user_fd, f".{info.job_id}.lock", 0):
                # Out of sight in one rename, then removed at leisure.
                gone = f".{info.job_id}.pruned.{os.getpid()}.{int(time.time())}.tmp"
                os.rename(info.job_id, gone, src_dir_fd=user_fd, dst_dir_fd=user_fd)
                remove_tree(user_fd, gone)
        except ArchiveError:
            return False  # an epilog holds the lock
    finally:
        os.close(user_fd)
    return True


def _remove_stale_temporaries(root_fd: int, now: float) -> None:
    for user_name in users(root_fd, None):
        user_fd = open_dir(root_fd, user_name)
        try:
            for entry in entries(user_fd):
                if not entry.name.startswith("."):
                    continue
                age = now - entry.stat(follow_symlinks=False).st_mtime
                if age < STALE_TEMP_S:
                    continue
                if entry.name.endswith(".tmp"):
                    remove_tree(user_fd, entry.name)
                elif entry.name.endswith(".lock") and not exists(
                        user_fd, entry.name[1:-len(".lock")]):
                    os.unlink(entry.name, dir_fd=user_fd)
        finally:
            os.close(user_fd)
