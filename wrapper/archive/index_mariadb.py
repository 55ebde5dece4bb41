"""The archive's index on MariaDB (or MySQL): ``[archive] index_backend = "mariadb"``.

The same ``Index`` as ``SqliteIndex`` (wrapper/archive/index.py), for sites where several
admin hosts read the index or one database serves several clusters: the database Slurm
sites already run for slurmdbd. What stays as it is: the epilogs write only the spool on
the archive (an epilog never waits on a database, up or down); one indexer at a time
folds it, under the archive's lock; the manifests stay the truth, and a rebuild makes a
cluster's rows again from them.

- **Where:** the client option file ``[archive] index_connection`` (``[client]`` host,
  port or socket, user, password, database), root's and 0600 (refused otherwise): only
  root's commands connect. An ordinary user's commands never do (``may_read``): they
  read their own folder of the archive, so a user sees the rows the file system lets
  them see, as with SQLite. No grant is given to users.
- **Several clusters:** each row carries its cluster (``[archive] cluster``, else
  slurm.conf's ``ClusterName``); every query, upsert and rebuild is that cluster's alone.
- **Formats:** table ``jobwrap_meta`` holds the tables' ``layout`` (``SCHEMA``) and one
  ``schema:CLUSTER`` row per cluster indexed. A newer layout raises FormatTooNew (the
  commands read the manifests); an older one is dropped and made again, and every
  cluster's rows are then rebuilt from its own manifests by its next reader.
- **The upsert** never replaces a newer row (``updated_at`` decides, assigned last since
  MariaDB evaluates ``ON DUPLICATE KEY UPDATE`` left to right); a **rebuild** is one
  transaction (delete the cluster's rows, insert them from the manifests, fold the
  spool), so a reader sees the old rows or the new ones, never half.
- **Faults:** a database that cannot be reached is ``IndexDown``: the commands say so in
  one line and read the manifests; nothing is rebuilt for it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from wrapper.archive.index_base import (
    LOCK_WAIT_S,
    SUMMARY,
    IndexDown,
    IndexFault,
    Rebuilt,
    _row,
    _Spooled,
    rebuilt_line,
    spooled_rows,
    unspool,
)
from wrapper.archive.info import ArchiveInfo
from wrapper.archive.spool import SCHEMA, record_of
from wrapper.archive.store import scan
from wrapper.errors import FormatTooNew

CONNECT_TIMEOUT_S = 5
QUERY_TIMEOUT_S = 60
BATCH = 2000  # rows per INSERT of a rebuild
# jobwrap_ names: the database may be shared (slurmdbd's server, another tool's schema)
_TABLES = """
CREATE TABLE IF NOT EXISTS jobwrap_jobs (
  cluster VARCHAR(64) NOT NULL, user VARCHAR(64) NOT NULL, job_id VARCHAR(64) NOT NULL,
  updated_at DOUBLE NOT NULL, size BIGINT NOT NULL, complete TINYINT NOT NULL,
  name TEXT NOT NULL, uid BIGINT, attempts TEXT NOT NULL, run_s DOUBLE NOT NULL,
  failures INT NOT NULL, ledger MEDIUMTEXT, parsed TINYINT NOT NULL,
  PRIMARY KEY (cluster, user, job_id),
  KEY jobwrap_updated (cluster, updated_at, job_id),
  KEY jobwrap_window (cluster, updated_at, run_s, failures),
  KEY jobwrap_id (cluster, job_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE TABLE IF NOT EXISTS jobwrap_meta (
  k VARCHAR(128) NOT NULL PRIMARY KEY, v BIGINT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
"""
# updated_at last: MariaDB assigns left to right, and each guard reads the row's own time.
_UPSERT = """
INSERT INTO jobwrap_jobs (cluster, user, job_id, updated_at, size, complete, name, uid, attempts,
                  run_s, failures, ledger, parsed)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON DUPLICATE KEY UPDATE
  size = IF(VALUES(updated_at) >= updated_at, VALUES(size), size),
  complete = IF(VALUES(updated_at) >= updated_at, VALUES(complete), complete),
  name = IF(VALUES(updated_at) >= updated_at, VALUES(name), name),
  uid = IF(VALUES(updated_at) >= updated_at, VALUES(uid), uid),
  attempts = IF(VALUES(updated_at) >= updated_at, VALUES(attempts), attempts),
  run_s = IF(VALUES(updated_at) >= updated_at, VALUES(run_s), run_s),
  failures = IF(VALUES(updated_at) >= updated_at, VALUES(failures), failures),
  ledger = IF(VALUES(updated_at) >= updated_at, VALUES(ledger), ledger),
  parsed = IF(VALUES(updated_at) >= updated_at, VALUES(parsed), parsed),
  updated_at = IF(VALUES(updated_at) >= updated_at, VALUES(updated_at), updated_at)
"""
_LIST = "SELECT user, job_id, updated_at, size, complete, name, attempts FROM jobwrap_jobs " \
        "WHERE cluster = %s AND updated_at >= %s{user} ORDER BY updated_at, job_id"
_LEDGERS = "SELECT job_id, user, ledger FROM jobwrap_jobs WHERE cluster = %s AND " \
           "updated_at >= %s{user}"
SUMMARY_FRESH_S = 300.0  # a read's fold that took nothing leaves a summary this young


def _driver() -> Any:
    try:
        import pymysql
    except ImportError:
        raise IndexDown("[archive] index_backend = \"mariadb\" needs PyMySQL on this host: "
                        "pip install 'jobwrap[mariadb]' into jobwrap's venv") from None
    return pymysql


def check_connection_file(path: str) -> None:
    """The option file holds a password: root's (or this process's owner's), 0600, a
    regular file reached without a symlink. Raises IndexDown saying which and the fix."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise IndexDown(f"[archive] index_connection {path}: no such file; write it "
                        "([client] host, port, user, password, database), mode 0600") from None
    except OSError as exc:
        raise IndexDown(f"[archive] index_connection {path}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise IndexDown(f"[archive] index_connection {path} is not a regular file (a "
                        "symlink?); refusing it")
    if info.st_uid not in (0, os.geteuid()) or info.st_mode & 0o077:
        raise IndexDown(f"[archive] index_connection {path} holds the database's password "
                        f"but is mode {stat.S_IMODE(info.st_mode):04o}, uid {info.st_uid}: "
                        f"chown root {path} && chmod 600 {path}")


class MariaDbIndex(_Spooled):
    """The index in a MariaDB database, this cluster's rows of it."""

    def __init__(self, root: str, connection: str, cluster: str, *,
                 lock_wait: float | None = None) -> None:
        self.root = root
        self.connection = connection
        self.cluster = cluster
        self.path = f"mariadb ({connection}), cluster {cluster}"
        self.lock_wait = LOCK_WAIT_S if lock_wait is None else lock_wait
        self._con: Any = None
        self._layout_ok = False  # this connection found (or made) this layout's tables

    # the connection
    def _connect(self) -> Any:
        check_connection_file(self.connection)
        pymysql = _driver()
        try:
            return pymysql.connect(
                read_default_file=self.connection, charset="utf8mb4", autocommit=False,
                connect_timeout=CONNECT_TIMEOUT_S, read_timeout=QUERY_TIMEOUT_S,
                write_timeout=QUERY_TIMEOUT_S)
        except pymysql.Error as exc:
            raise IndexDown(f"the index database cannot be reached ({self.connection}: "
                            f"{_said(exc)})") from None

    def _db(self) -> Any:
        if self._con is None:
            self._con = self._connect()
        return self._con

    def close(self) -> None:
        self._layout_ok = False
        if self._con is not None:
            with contextlib.suppress(Exception):
                self._con.close()
            self._con = None

    @contextlib.contextmanager
    def _cursor(self, what: str, *, commit: bool = False) -> Iterator[Any]:
        """A cursor of the connection; ``commit``: its work committed at the end. Any
        database error closes the connection (never reused half broken): one that cannot
        reach the server is IndexDown, any other IndexFault."""
        pymysql = _driver()
        con = self._db()
        try:
            with con.cursor() as cursor:
                yield cursor
            if commit:
                con.commit()
        except (pymysql.err.OperationalError, pymysql.err.InterfaceError) as exc:
            self.close()
            raise IndexDown(f"the index database {what}: {_said(exc)}") from None
        except pymysql.Error as exc:
            self.close()
            raise IndexFault(f"the index {self.path} {what} ({_said(exc)})") from None
        except BaseException:
            self.close()  # the server rolls back what the connection left open
            raise

    def _layout(self, cursor: Any) -> int | None:
        """The tables' layout (None: no tables yet); FormatTooNew above ``SCHEMA``."""
        cursor.execute("SELECT COUNT(*) FROM information_schema.tables WHERE "
                       "table_schema = DATABASE() AND table_name = 'jobwrap_meta'")
        if not cursor.fetchone()[0]:
            return None
        cursor.execute("SELECT v FROM jobwrap_meta WHERE k = 'layout'")
        found = cursor.fetchone()
        layout = int(found[0]) if found else None
        if layout is not None and layout > SCHEMA:
            self.close()
            raise FormatTooNew(self.path, "archive index", layout, SCHEMA)
        return layout

    def _ensure_tables(self, cursor: Any) -> None:
        """The tables, of this layout: an older layout's are dropped (every cluster's rows
        are rebuilt from its own manifests by its next reader). Once per connection."""
        if self._layout_ok:
            return
        layout = self._layout(cursor)
        if layout is not None and layout < SCHEMA:
            cursor.execute("DROP TABLE IF EXISTS jobwrap_jobs, jobwrap_meta")
        if layout != SCHEMA:
            for statement in filter(None, (s.strip() for s in _TABLES.split(";"))):
                cursor.execute(statement)
            cursor.execute("INSERT INTO jobwrap_meta (k, v) VALUES ('layout', %s) "
                           "ON DUPLICATE KEY UPDATE v = VALUES(v)", (SCHEMA,))
        self._layout_ok = True

    # reading
    def check(self) -> None:
        with self._cursor("cannot be read", commit=True) as cursor:  # then a fresh snapshot
            layout = self._layout(cursor)
            if layout is None:
                raise IndexFault(f"there is no index in {self.path}")
            if layout < SCHEMA:
                raise IndexFault(f"the index {self.path} has layout {layout}, not {SCHEMA}")
            cursor.execute("SELECT v FROM jobwrap_meta WHERE k = %s",
                           (f"schema:{self.cluster}",))
            if cursor.fetchone() is None:
                raise IndexFault(f"there is no index of cluster {self.cluster} in "
                                 f"{self.connection}")
        self._layout_ok = True

    def _select(self, what: str, since: float, user: str | None) -> Iterator[Any]:
        """The rows as the server sends them (an unbuffered cursor on a connection of its
        own, so the caller may ask other things meanwhile): memory does not grow with the
        archive."""
        pymysql = _driver()
        sql = {"list": _LIST, "ledgers": _LEDGERS}[what]
        args: tuple[Any, ...] = (self.cluster, since)
        if user is not None:
            args += (user,)
        con = self._connect()
        try:
            with con.cursor(pymysql.cursors.SSCursor) as cursor:
                cursor.execute(sql.format(user=" AND user = %s" if user is not None else ""),
                               args)
                while batch := cursor.fetchmany(BATCH):
                    yield from batch
        except (pymysql.err.OperationalError, pymysql.err.InterfaceError) as exc:
            raise IndexDown(f"the index database cannot be read: {_said(exc)}") from None
        except pymysql.Error as exc:
            raise IndexFault(f"the index {self.path} cannot be read ({_said(exc)})") from None
        finally:
            with contextlib.suppress(Exception):
                con.close()  # a generator closed early: the rest of the rows are dropped

    def _one(self, sql: str, args: tuple[Any, ...]) -> Any:
        with self._cursor("cannot be read") as cursor:
            cursor.execute(sql, args)
            return cursor.fetchall()

    def total_size(self) -> int:
        return int(self._one("SELECT COALESCE(SUM(size), 0) FROM jobwrap_jobs WHERE "
                             "cluster = %s", (self.cluster,))[0][0])

    def locate(self, job_id: str) -> list[str]:
        return [u for (u,) in self._one("SELECT user FROM jobwrap_jobs WHERE cluster = %s "
                                        "AND job_id = %s ORDER BY updated_at DESC",
                                        (self.cluster, job_id))]

    def mtbf(self, since: float) -> float | None:
        """Summed from the covering index alone (the optimizer, seeing one cluster's rows,
        would otherwise read the table through its primary key)."""
        run_s, failures = self._one(
            "SELECT COALESCE(SUM(run_s), 0), COALESCE(SUM(failures), 0) FROM jobwrap_jobs "
            "FORCE INDEX (jobwrap_window) WHERE cluster = %s AND updated_at >= %s",
            (self.cluster, since))[0]
        return float(run_s) / int(failures) if failures else None

    # writing (one indexer at a time: the archive's lock)
    def fold(self) -> int:
        with self._writing() as (index_fd, spool_fd):
            names, rows, newer = spooled_rows(spool_fd, self.root)
            with self._cursor("cannot take the spool", commit=True) as cursor:
                self._ensure_tables(cursor)
                if rows:
                    self._insert(cursor, rows)
                    self._mark(cursor)
            unspool(spool_fd, names, newer)
            if rows or _age(index_fd, SUMMARY) > SUMMARY_FRESH_S:
                self._summarize(index_fd)
        return len(rows)

    def rebuild(self, say: Callable[[str], None] | None = None) -> Rebuilt:
        with self._writing() as (index_fd, spool_fd):
            with self._cursor("cannot be built", commit=True) as cursor:
                self._ensure_tables(cursor)  # DDL commits by itself
            jobs, skipped = 0, []
            with self._cursor("cannot be built", commit=True) as cursor:  # one transaction
                cursor.execute("DELETE FROM jobwrap_jobs WHERE cluster = %s", (self.cluster,))
                batch: list[tuple[Any, ...]] = []
                for info, manifest in scan(self.root):
                    if manifest is None:
                        skipped.append(f"{info.user}/{info.job_id}")
                    batch.append(_row(record_of(self.root, info.user, info.job_id, manifest,
                                                info.size, info.updated_at)))
                    jobs += 1
                    if len(batch) >= BATCH:
                        self._insert(cursor, batch)
                        batch = []
                self._insert(cursor, batch)
                names, rows, newer = spooled_rows(spool_fd, self.root)
                self._insert(cursor, rows)
                self._mark(cursor)
            unspool(spool_fd, names, newer)
            self._summarize(index_fd)
        if say is not None:
            say(rebuilt_line(self.path, jobs, skipped))
        return Rebuilt(jobs, skipped, len(rows))

    def forget(self, removed: Iterable[ArchiveInfo]) -> None:
        with self._writing(), self._cursor("cannot be written", commit=True) as cursor:
            cursor.executemany("DELETE FROM jobwrap_jobs WHERE cluster = %s AND user = %s "
                               "AND job_id = %s", [(self.cluster, r.user, r.job_id)
                                                   for r in removed])

    def _insert(self, cursor: Any, rows: list[tuple[Any, ...]]) -> None:
        if rows:
            cursor.executemany(_UPSERT, [(self.cluster, *row) for row in rows])

    def _mark(self, cursor: Any) -> None:
        cursor.execute("INSERT INTO jobwrap_meta (k, v) VALUES (%s, %s) ON DUPLICATE KEY "
                       "UPDATE v = VALUES(v)", (f"schema:{self.cluster}", SCHEMA))


def _age(dir_fd: int, name: str) -> float:
    """Seconds since ``name`` in the folder ``dir_fd`` was written (infinite: never)."""
    import time

    try:
        return time.time() - os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mtime
    except OSError:
        return float("inf")


def _said(exc: BaseException) -> str:
    args: tuple[Any, ...] = tuple(getattr(exc, "args", ()))
    if len(args) >= 2 and isinstance(args[1], str):
        return f"{args[1]} (error {args[0]})"
    return str(exc) or type(exc).__name__


def cluster_name(configured: str) -> str:
    """This cluster's name in a shared index: the config's, else slurm.conf's."""
    if configured:
        return configured
    from pathlib import Path

    from wrapper.slurm.conf import DEFAULT_SLURM_CONF, parse_slurm_conf

    try:
        conf = parse_slurm_conf(Path(os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF))
    except OSError:
        return "default"
    name = (conf.get("ClusterName") or "").strip()
    return name[:64] if name else "default"
