"""What every backend of the archive's index shares (wrapper/archive/index.py says what
the index is; index_mariadb.py is the server backend): the ``Index`` the commands use, its
faults, a spool record's row, and the spool on the archive folded by one indexer at a
time under the archive's lock, with the summary file it leaves."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, Protocol

from wrapper.archive._fs import (
    ArchiveError,
    entries,
    locked,
    make_dir,
    open_dir,
    open_root,
    read_json,
    tree_size,
    write_json_atomic,
)
from wrapper.archive.info import ArchiveInfo
from wrapper.archive.manifest import MANIFEST
from wrapper.archive.spool import FOLDER, PASSABLE, PRIVATE, SCHEMA, SPOOL, record_of
from wrapper.errors import FormatTooNew
from wrapper.fastdataclass import dataclass

LOCK = "indexer.lock"
SUMMARY = "summary.json"
MTBF_WINDOW_S = 30 * 86400.0
LOCK_WAIT_S = 10.0  # how long a reader waits for another indexer before it reads as is
EVER = -1e18  # "since" when none is given: every row, the same statement


class IndexFault(ArchiveError):
    """The index cannot be read or written (missing, damaged, of another schema)."""


class IndexLocked(IndexFault):
    """Another indexer holds the lock."""


class IndexDown(IndexFault):
    """The index's database cannot be reached (a server backend down, no driver): the
    commands read the manifests; nothing is rebuilt for it."""


@dataclass(frozen=True)
class Rebuilt:
    jobs: int
    skipped: list[str]  # "user/jobid": manifests that did not parse (the jobs stay listed)
    folded: int = 0


class Index(Protocol):
    """What the commands ask of the index, whatever keeps it."""

    path: str  # where it is, for messages

    def check(self) -> None: ...
    def close(self) -> None: ...
    def fold(self) -> int: ...
    def rebuild(self, say: Callable[[str], None] | None = None) -> Rebuilt: ...
    def jobs(self, *, since: float | None = None, user: str | None = None) -> list[ArchiveInfo]: ...
    def stream(self, *, since: float | None = None,
               user: str | None = None) -> Generator[ArchiveInfo, None, None]: ...
    def total_size(self) -> int: ...
    def locate(self, job_id: str) -> list[str]: ...
    def ledgers(self, *, since: float | None,
                user: str | None) -> Iterator[tuple[str, str, dict[str, Any] | None]]: ...
    def mtbf(self, since: float) -> float | None: ...
    def forget(self, removed: Iterable[ArchiveInfo]) -> None: ...


def _row(record: dict[str, Any]) -> tuple[Any, ...]:
    ledger = record.get("ledger")
    return (str(record["user"]), str(record["job_id"]), float(record["updated_at"]),
            int(record["size"]), int(bool(record["complete"])), str(record["name"]),
            record.get("uid"), json.dumps(record["attempts"]), float(record["run_s"]),
            int(record["failures"]), None if ledger is None else json.dumps(ledger),
            int(bool(record["parsed"])))


# -- what every backend shares: the spool on the archive, one indexer at a time ------------
class _Spooled:
    """The lock and the spool (both in ``<archive_root>/.index``), and the summary file:
    the same whatever database keeps the rows."""

    root: str
    path: str
    lock_wait: float

    def close(self) -> None:
        raise NotImplementedError

    def mtbf(self, since: float) -> float | None:
        raise NotImplementedError

    def _select(self, what: str, since: float, user: str | None) -> Iterator[Any]:
        """The rows of ``what`` ("list": user, job id, updated_at, size, complete, name,
        attempts; "ledgers": job id, user, ledger) updated since ``since``, oldest first,
        of ``user``'s jobs (None: everyone's), as the database sends them."""
        raise NotImplementedError

    def jobs(self, *, since: float | None = None, user: str | None = None) -> list[ArchiveInfo]:
        return list(self.stream(since=since, user=user))

    def stream(self, *, since: float | None = None,
               user: str | None = None) -> Generator[ArchiveInfo, None, None]:
        """The jobs, oldest first, read as they are used (``close()`` it when stopping
        early)."""
        for u, j, t, s, c, n, a in self._select("list", EVER if since is None else since,
                                                user):
            yield ArchiveInfo(user=u, job_id=j, path=os.path.join(self.root, u, j),
                              updated_at=float(t), size=int(s), complete=bool(c), name=n,
                              attempts=json.loads(a))

    def ledgers(self, *, since: float | None,
                user: str | None) -> Iterator[tuple[str, str, dict[str, Any] | None]]:
        for job_id, name, ledger in self._select("ledgers",
                                                 EVER if since is None else since, user):
            yield job_id, name, None if ledger is None else json.loads(ledger)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[tuple[int, int]]:
        """The lock, and the index folder's and spool's descriptors."""
        root_fd = open_root(self.root, create=False)
        try:
            index_fd = make_dir(root_fd, FOLDER, PASSABLE)
        finally:
            os.close(root_fd)
        try:
            spool_fd = make_dir(index_fd, SPOOL, PRIVATE)
            try:
                with contextlib.ExitStack() as stack:
                    try:
                        stack.enter_context(locked(index_fd, LOCK, self.lock_wait))
                    except ArchiveError as exc:
                        raise IndexLocked(str(exc)) from None
                    # A connection opened before the lock may be to a file another
                    # indexer's rebuild has since renamed away: writes there would be lost.
                    self.close()
                    yield index_fd, spool_fd
            finally:
                os.close(spool_fd)
        finally:
            os.close(index_fd)

    def _summarize(self, index_fd: int) -> None:
        now = time.time()
        write_json_atomic(index_fd, SUMMARY, {"written_at": now, "window_s": MTBF_WINDOW_S,
                                              "mtbf_s": self.mtbf(now - MTBF_WINDOW_S)},
                          PASSABLE)


def spooled_rows(spool_fd: int, root: str) -> tuple[list[str], list[tuple[Any, ...]],
                                                    dict[str, int]]:
    """The spool's file names, their rows (``_row``) and the names a newer jobwrap wrote
    (left for its indexer): an older record's job is read again from its manifest."""
    names = sorted(e.name for e in entries(spool_fd)
                   if e.name.endswith(".json") and not e.name.startswith("."))
    rows: list[tuple[Any, ...]] = []
    newer: dict[str, int] = {}
    for name in names:
        record = read_json(spool_fd, name)
        version = record.get("v", 1) if record is not None else None
        if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA:
            newer[name] = version  # a newer jobwrap's indexer folds it: left where it is
            continue
        if record is not None and version != SCHEMA:  # an older jobwrap's epilog wrote it
            record = _from_archive(root, record.get("user"), record.get("job_id"))
        if record is not None:
            with contextlib.suppress(KeyError, TypeError, ValueError):
                rows.append(_row(record))
    return names, rows, newer


def unspool(spool_fd: int, names: list[str], newer: dict[str, int]) -> None:
    """The folded records out of the spool, once their rows are committed (a crash before
    folds them again, harmlessly); a word on those a newer jobwrap left."""
    for name in names:
        if name not in newer:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=spool_fd)
    if newer:
        from wrapper import log

        first = min(newer)
        log.get().warning("archive.index_spool_newer", records=len(newer), error=str(
            FormatTooNew(f"spool record {first}", "index record", newer[first], SCHEMA)))


def _from_archive(root: str, user: object, job_id: object) -> dict[str, Any] | None:
    """A job's index record made again from its archive (an older spool record's job, in
    this jobwrap's schema); None when its folder is gone or the names are not names."""
    if not isinstance(user, str) or not isinstance(job_id, str) or "/" in user + job_id \
            or user.startswith(".") or job_id.startswith("."):
        return None
    try:
        root_fd = open_root(root, create=False)
        try:
            user_fd = open_dir(root_fd, user)
            try:
                job_fd = open_dir(user_fd, job_id)
                try:
                    manifest = read_json(job_fd, MANIFEST)
                    size, mtime = tree_size(job_fd), os.fstat(job_fd).st_mtime
                finally:
                    os.close(job_fd)
            finally:
                os.close(user_fd)
        finally:
            os.close(root_fd)
    except (OSError, ArchiveError):
        return None
    return record_of(root, user, job_id, manifest, size, mtime)


def rebuilt_line(path: str, jobs: int, skipped: list[str]) -> str:
    """What a rebuild says: how many jobs, and the manifests that did not parse."""
    more = f" and {len(skipped) - 10} more" if len(skipped) > 10 else ""
    return f"archive index {path}: {jobs} jobs" + (
        f"; manifests that do not parse (listed, not in reports): "
        f"{', '.join(skipped[:10])}{more}" if skipped else "")
