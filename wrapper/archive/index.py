"""The archive's index: one small record per job, so that no command walks the archive.

``status``, ``report``, ``archive list``, ``archive prune`` and the Young/Daly advice read
it; the manifests stay the source of truth, and the index can always be built again from
them (``jobwrap archive reindex``).

Who writes what, and when:

- the epilog (``store.Writer.commit``, root) drops the job's record, a small JSON file,
  in ``<archive_root>/.index/spool/`` (write, fsync, rename), after the manifest is in
  place (``wrapper.archive.spool``: the record, the spool's names and format). No
  SQLite there: a spool write that fails (a full disk) is logged and the epilog goes on;
  the manifest is already whole, and ``reindex`` finds the job again.
- one indexer at a time, under ``.index/indexer.lock``, folds the spool into the
  database and removes the folded files: whoever reads the index as root does that first
  (``reading``), and so do ``jobwrap archive index`` (a timer's job) and ``reindex``.
  A spool record is an upsert keyed by (user, job id) that never replaces a newer row,
  so folding twice, or in any order, gives the same index. A rebuild writes a new
  database beside the old one and renames it into place: a reader sees the old index or
  the new one, never half of one.
- formats (docs/upgrades.md): a spool record's ``v`` and the database's ``user_version``
  are ``SCHEMA``. A spool record an older jobwrap wrote (an epilog on a node not yet
  upgraded) is read again from its job's manifest; one a newer jobwrap wrote stays in
  the spool for that jobwrap's indexer. An older database is built again from the
  manifests; a newer one raises FormatTooNew, and the commands read the manifests.
- after each fold the indexer writes ``.index/summary.json`` (0644): the cluster's MTBF
  over the last 30 days, an aggregate with no user's row in it, which ``jobwrap status``
  of an ordinary user reads for its checkpoint advice.

Who reads it (the archive's access rule, ``wrapper.archive.access``): the database is
root's, 0600, in a 0711 folder: root (and whoever owns the archive root) reads it; an
ordinary user's commands do not open it and read their own folder of the archive, as
the file system lets them (``store.scan``). So the index shows no one a row the archive
itself would not.

The seam: ``Index`` is what the commands use; ``[archive] index_backend`` picks
``SqliteIndex`` (one file on one host, the default) or ``MariaDbIndex``
(wrapper/archive/index_mariadb.py: a server database, one for several clusters).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from wrapper.archive._fs import (
    ArchiveError,
    make_dir,
    open_dir,
    open_root,
    read_json,
    write_json_atomic,
)
from wrapper.archive.index_base import (
    LOCK,
    LOCK_WAIT_S,
    MTBF_WINDOW_S,
    SUMMARY,
    Index,
    IndexDown,
    IndexFault,
    IndexLocked,
    Rebuilt,
    _row,
    _Spooled,
    rebuilt_line,
    spooled_rows,
    unspool,
)
from wrapper.archive.info import ArchiveInfo
from wrapper.archive.spool import FOLDER, PASSABLE, SCHEMA, SPOOL, record_of
from wrapper.archive.store import scan
from wrapper.errors import FormatTooNew
from wrapper.fastdataclass import dataclass

if TYPE_CHECKING:
    import sqlite3

    from wrapper.config import Config

DATABASE = "archive.sqlite"
LAST_RUN = "indexer.json"  # the last `jobwrap archive index` (a timer's): when, how much
BACKLOG_MAX = 100_000  # spool files counted at most (jobwrap doctor, the metrics)

_SCHEMA_SQL = f"""
CREATE TABLE IF NOT EXISTS jobs (
  user TEXT NOT NULL, job_id TEXT NOT NULL, updated_at REAL NOT NULL, size INTEGER NOT NULL,
  complete INTEGER NOT NULL, name TEXT NOT NULL, uid INTEGER, attempts TEXT NOT NULL,
  run_s REAL NOT NULL, failures INTEGER NOT NULL, ledger TEXT, parsed INTEGER NOT NULL,
  UNIQUE (user, job_id));
CREATE INDEX IF NOT EXISTS jobs_updated ON jobs (updated_at);
CREATE INDEX IF NOT EXISTS jobs_window ON jobs (updated_at, run_s, failures);
CREATE INDEX IF NOT EXISTS jobs_id ON jobs (job_id);
PRAGMA user_version = {SCHEMA};
"""
_UPSERT = """
INSERT INTO jobs (user, job_id, updated_at, size, complete, name, uid, attempts, run_s,
                  failures, ledger, parsed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (user, job_id) DO UPDATE SET updated_at = excluded.updated_at,
  size = excluded.size, complete = excluded.complete, name = excluded.name,
  uid = excluded.uid, attempts = excluded.attempts, run_s = excluded.run_s,
  failures = excluded.failures, ledger = excluded.ledger, parsed = excluded.parsed
WHERE excluded.updated_at >= jobs.updated_at
"""
_LIST = {False: "SELECT user, job_id, updated_at, size, complete, name, attempts FROM jobs "
                "WHERE updated_at >= ? ORDER BY updated_at, job_id",
         True: "SELECT user, job_id, updated_at, size, complete, name, attempts FROM jobs "
               "WHERE updated_at >= ? AND user = ? ORDER BY updated_at, job_id"}
_LEDGERS = {False: "SELECT job_id, user, ledger FROM jobs WHERE updated_at >= ?",
            True: "SELECT job_id, user, ledger FROM jobs WHERE updated_at >= ? AND user = ?"}

__all__ = ["LOCK", "LOCK_WAIT_S", "MTBF_WINDOW_S", "SUMMARY", "Index", "IndexDown",
           "IndexFault", "IndexLocked", "Rebuilt", "SqliteIndex", "backend", "reading"]


# -- the SQLite backend --------------------------------------------------------------------
class SqliteIndex(_Spooled):
    """The index in one SQLite file (default ``<archive_root>/.index/archive.sqlite``)."""

    def __init__(self, root: str, path: str = "", *, lock_wait: float | None = None) -> None:
        self.root = root
        self.path = path or os.path.join(root, FOLDER, DATABASE)
        self.lock_wait = LOCK_WAIT_S if lock_wait is None else lock_wait
        self._con: sqlite3.Connection | None = None

    # reading
    def _db(self) -> sqlite3.Connection:
        if self._con is None:
            self._con = _connect(self.path, create=False)
        return self._con

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None

    def check(self) -> None:
        """Raises IndexFault when the index is missing, damaged or of an older schema (it
        is built again), FormatTooNew when a newer jobwrap made it."""
        import sqlite3

        try:
            version = self._version()
            if version != SCHEMA:
                raise IndexFault(f"the index {self.path} has schema {version}, not {SCHEMA}")
            self._db().execute("SELECT user, job_id FROM jobs LIMIT 1").fetchall()
        except sqlite3.DatabaseError as exc:
            self.close()
            raise IndexFault(f"the index {self.path} is damaged ({exc})") from None

    def _version(self) -> int:
        """The database's schema (``PRAGMA user_version``); FormatTooNew above ``SCHEMA``."""
        version = int(self._db().execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA:
            self.close()
            raise FormatTooNew(self.path, "archive index", version, SCHEMA)
        return version

    def _select(self, what: str, since: float, user: str | None) -> Iterator[Any]:
        sql = {"list": _LIST, "ledgers": _LEDGERS}[what][user is not None]
        return self._rows(sql, (since,) if user is None else (since, user))

    def total_size(self) -> int:
        return int(self._query("SELECT total(size) FROM jobs", ())[0][0])

    def locate(self, job_id: str) -> list[str]:
        """The users whose archive holds a job of this id (a reused id: more than one)."""
        return [u for (u,) in self._query("SELECT user FROM jobs WHERE job_id = ? "
                                          "ORDER BY updated_at DESC", (job_id,))]

    def mtbf(self, since: float) -> float | None:
        """Attempt run time per failure over the jobs updated since ``since``: what
        ``report.build`` says of the same jobs, summed from the covering index
        ``jobs_window`` alone (no table row read)."""
        rows = self._query("SELECT total(run_s), total(failures) FROM jobs "
                           "WHERE updated_at >= ?", (since,))
        run_s, failures = rows[0]
        return float(run_s) / failures if failures else None

    def _rows(self, sql: str, args: tuple[Any, ...]) -> Iterator[Any]:
        """A query's rows as the cursor gives them: memory does not grow with the archive."""
        import sqlite3

        try:
            cursor = self._db().execute(sql, args)
            try:
                yield from cursor
            finally:
                cursor.close()
        except sqlite3.DatabaseError as exc:
            self.close()
            raise IndexFault(f"the index {self.path} cannot be read ({exc})") from None

    def _query(self, sql: str, args: tuple[Any, ...]) -> list[Any]:
        import sqlite3

        try:
            return self._db().execute(sql, args).fetchall()
        except sqlite3.DatabaseError as exc:
            self.close()
            raise IndexFault(f"the index {self.path} cannot be read ({exc})") from None

    # writing (one indexer at a time: _Spooled._writing)
    def fold(self) -> int:
        """Fold the spool into the index; returns how many records it took."""
        import sqlite3

        with self._writing() as (index_fd, spool_fd):
            con = self._db()
            try:
                self._version()  # never relabel a newer jobwrap's index as this one's
                con.executescript(_SCHEMA_SQL)  # what a newer jobwrap adds (IF NOT EXISTS)
            except sqlite3.DatabaseError as exc:
                raise IndexFault(f"the index {self.path} cannot be written ({exc})") from None
            taken = _fold(con, spool_fd, self.root)
            self._summarize(index_fd)
        return taken

    def rebuild(self, say: Callable[[str], None] | None = None) -> Rebuilt:
        """A new index from every manifest (and the spool), renamed over the old one."""
        with self._writing() as (index_fd, spool_fd):
            folder = os.path.dirname(self.path)
            tmp = os.path.join(folder, f".{os.path.basename(self.path)}.{os.getpid()}."
                               f"{secrets.token_hex(4)}.tmp")
            con = _connect(tmp, create=True)
            try:
                jobs, skipped = 0, []
                for info, manifest in scan(self.root):
                    if manifest is None:
                        skipped.append(f"{info.user}/{info.job_id}")
                    con.execute(_UPSERT, _row(record_of(
                        self.root, info.user, info.job_id, manifest, info.size,
                        info.updated_at)))
                    jobs += 1
                folded = _fold(con, spool_fd, self.root)
                con.close()
                os.rename(tmp, self.path)
            except BaseException:
                con.close()
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            self._summarize(index_fd)
        if say is not None:
            say(rebuilt_line(self.path, jobs, skipped))
        return Rebuilt(jobs, skipped, folded)

    def forget(self, removed: Iterable[ArchiveInfo]) -> None:
        with self._writing():
            con = self._db()
            with con:
                con.executemany("DELETE FROM jobs WHERE user = ? AND job_id = ?",
                                [(r.user, r.job_id) for r in removed])


def _fold(con: sqlite3.Connection, spool_fd: int, root: str) -> int:
    """The spool's records into ``con``, then out of the spool; returns how many."""
    import sqlite3

    names, rows, newer = spooled_rows(spool_fd, root)
    try:
        with con:
            con.executemany(_UPSERT, rows)
    except sqlite3.DatabaseError as exc:
        raise IndexFault(f"the index cannot take the spool ({exc})") from None
    unspool(spool_fd, names, newer)
    return len(rows)


def _connect(path: str, *, create: bool) -> sqlite3.Connection:
    """The database at ``path``: never through a symlink, created 0600 (its journal takes
    the same mode), and raising IndexFault when it is missing or not a file."""
    import sqlite3

    if create:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600)
        os.close(fd)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise IndexFault(f"there is no index at {path}") from None
    if not stat.S_ISREG(info.st_mode):
        raise IndexFault(f"{path} is not a regular file (a symlink?); refusing it")
    con = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=LOCK_WAIT_S,
                          isolation_level=None if create else "DEFERRED")
    if create:
        con.executescript(_SCHEMA_SQL)
        con.execute("BEGIN")
    return con


# -- what the commands call ----------------------------------------------------------------
@dataclass(frozen=True)
class Backlog:
    """The spool's records not yet folded: how many (at most BACKLOG_MAX), the oldest's
    age in seconds (None: none), and the last indexer run's record (None: never)."""

    records: int
    oldest_s: float | None
    last_run: dict[str, Any] | None


def backlog(root: str, now: float | None = None) -> Backlog:
    """What waits in the spool, and when the indexer last ran (root; never raises)."""
    now = time.time() if now is None else now
    records, oldest = 0, None
    last = None
    try:
        root_fd = open_root(root, create=False)
    except (ArchiveError, OSError):
        return Backlog(0, None, None)
    try:
        index_fd = open_dir(root_fd, FOLDER)
        try:
            with contextlib.suppress(ArchiveError, OSError, ValueError):
                last = read_json(index_fd, LAST_RUN)
            with contextlib.suppress(ArchiveError, OSError):
                spool_fd = open_dir(index_fd, SPOOL)
                try:
                    with os.scandir(spool_fd) as found:
                        for entry in found:
                            if not entry.name.endswith(".json"):
                                continue
                            records += 1
                            with contextlib.suppress(OSError):
                                mtime = entry.stat(follow_symlinks=False).st_mtime
                                oldest = mtime if oldest is None else min(oldest, mtime)
                            if records >= BACKLOG_MAX:
                                break
                finally:
                    os.close(spool_fd)
        finally:
            os.close(index_fd)
    except (ArchiveError, OSError):
        pass
    finally:
        os.close(root_fd)
    return Backlog(records, None if oldest is None else max(0.0, now - oldest),
                   last if isinstance(last, dict) else None)


def record_run(root: str, *, folded: int, seconds: float, rebuilt: bool) -> Backlog:
    """The indexer's own record of a run (``.index/indexer.json``), and what it left."""
    root_fd = open_root(root, create=False)
    try:
        index_fd = make_dir(root_fd, FOLDER, PASSABLE)
        try:
            write_json_atomic(index_fd, LAST_RUN, {"ran_at": time.time(), "folded": folded,
                                                   "seconds": round(seconds, 3),
                                                   "rebuilt": rebuilt}, PASSABLE)
        finally:
            os.close(index_fd)
    finally:
        os.close(root_fd)
    return backlog(root)


def may_read(root: str) -> bool:
    """Whether this process reads the index: root, or the archive root's owner (a test's,
    a sandbox's). Anyone else reads their own folder of the archive."""
    if os.geteuid() == 0:
        return True
    try:
        return os.stat(root).st_uid == os.geteuid()
    except OSError:
        return False


def backend(cfg: Config) -> Index:
    """The index ``[archive] index_backend`` names: SQLite, or MariaDB
    (wrapper/archive/index_mariadb.py, imported only there)."""
    if cfg.archive.index_backend == "mariadb":
        from wrapper.archive.index_mariadb import MariaDbIndex, cluster_name

        return MariaDbIndex(cfg.paths.archive_root, cfg.archive.index_connection,
                            cluster_name(cfg.archive.cluster))
    return SqliteIndex(cfg.paths.archive_root, cfg.archive.index_path)


def reading(cfg: Config, say: Callable[[str], None]) -> Index | None:
    """The index, its spool folded in, ready to read; None when this process may not read
    it (an ordinary user) or nothing is archived yet. A missing or damaged index is built
    again from the manifests, with one line through ``say``; a lock held by another
    indexer for longer than ``LOCK_WAIT_S`` reads the index as it is."""
    root = cfg.paths.archive_root
    if not os.path.isdir(root) or not may_read(root):
        return None
    index = backend(cfg)
    try:
        try:
            index.check()
            index.fold()
        except IndexLocked as exc:
            say(f"{exc}; reading the index without the newest jobs")
        except IndexDown as exc:  # nothing to rebuild: the database is not there
            index.close()
            say(f"{exc}; reading the manifests instead")
            return None
        except IndexFault as exc:
            why = str(exc)
            index.rebuild(lambda line: say(f"{why}: built it again from the manifests; {line}"))
    except FormatTooNew as exc:  # a newer jobwrap's index: not this one's to rebuild
        index.close()
        say(f"{exc}; reading the manifests instead")
        return None
    except (ArchiveError, OSError) as exc:  # a rebuild that cannot run: locked, no room ...
        index.close()
        said = exc.strerror or str(exc) if isinstance(exc, OSError) else str(exc)
        say(f"the archive index cannot be used ({said}); reading the manifests instead")
        return None
    return index
