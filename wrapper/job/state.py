"""Per-job state: ``<state_dir>/jobs/<jobid>/``, append-only JSON-lines event records.

Two files, so that what root wrote can always be told from what the job's user wrote:
``events.jsonl`` (root's hooks; owned by root) and ``user-events.jsonl`` (hooks that run
as the job user, such as task-prolog and the supervisor; created by the prolog and owned
by that user). Each event is one line written with a single ``write`` on an O_APPEND
descriptor under an exclusive lock, then fsynced, so concurrent writers never tear a line.
Root's appends take that lock on ``.events.lock``, a file only root can open: the job's
user reads ``events.jsonl`` through an ACL, and any reader can ``flock`` what it opened.

Safety (all through ``wrapper.osl.files``): folders are 0711 and root's; every file is
0600, root's files readable by the job's user through a POSIX ACL (where the file system
has them), so a user sharing the job user's group reads nothing. Nothing is opened
through a symlink or blocks on a FIFO. The user's file is capped (``[hooks]
user_events_max``): an append past the cap is dropped with one log line, and only its
last ``user_events_max`` bytes are ever read; each line is decoded by
``osl.jsontext`` (bounded length and nesting: a line no reader can take is dropped, the
reader goes on). A job id reused by another user finds the
old job's folder moved aside. Every OS error (a full disk) is a StateError.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wrapper.errors import FormatTooNew, StateError, format_of
from wrapper.fastdataclass import dataclass
from wrapper.job.paths import EVENTS, JOB_ID, JobPaths
from wrapper.job.paths import USER_EVENTS as USER_EVENTS
from wrapper.osl import files, jsontext

if TYPE_CHECKING:
    from wrapper.config import Config

ROOT_EVENTS = EVENTS
# Root's appends lock this file (root's, 0600, no ACL), never events.jsonl itself: the
# job's user may open events.jsonl to read it, and could hold a flock on it for ever.
ROOT_LOCK = ".events.lock"
USER_EVENTS_MAX = 1 << 20  # the default of [hooks] user_events_max
ROOT_EVENTS_MAX = 64 << 20  # root's own file: bounded too, never read whole past this
USER_LINE_MAX = 256 << 10  # one line of the user's file: a longer one is dropped unread
DIR_MODE, FILE_MODE = 0o711, 0o600
# The format of one event line, in its "v" field (docs/upgrades.md). Absent: 1, and 1 is
# written without it. Kinds and fields are only ever added within a format (a reader
# skips a kind it does not know, and a field it does not know); a line a reader of the
# previous format would misread takes the next number.
EVENTS_FORMAT = 1
FORMAT_KEY = "v"
_JOB_ID = JOB_ID
_warned_full: set[str] = set()


@dataclass(frozen=True)
class JobState:
    state_dir: Path
    job_id: str
    user_events_max: int = USER_EVENTS_MAX

    def __post_init__(self) -> None:
        if not _JOB_ID.match(self.job_id):
            raise StateError(f"{self.job_id!r} is not a job id; refusing to use it in a path")

    @property
    def path(self) -> Path:
        return JobPaths(self.state_dir, self.job_id).folder

    def prepare(self, uid: int | None, gid: int | None,
                user_files: tuple[str, ...] = (USER_EVENTS,)) -> None:
        """Create the job directory and the files the job user writes (root, idempotent).

        Safe when several nodes' prologs share one state_dir and race: every step
        tolerates the other having done it, and checks what it finds.
        """
        try:
            os.makedirs(self.state_dir.parent, 0o755, exist_ok=True)
            files.private_mkdir(self.state_dir, DIR_MODE)
            files.private_mkdir(self.state_dir / "jobs", DIR_MODE)
            self._make_job_dir(uid, user_files)
            if os.geteuid() != 0 or uid is None:
                return
            for name in user_files:
                self._make_user_file(name, uid, gid)
            self._make_root_file(ROOT_EVENTS, uid)
        except files.UnsafeFileError as exc:
            raise StateError(str(exc)) from None
        except OSError as exc:
            raise StateError(f"cannot prepare {self.path}: {_why(exc)}") from None

    def _make_job_dir(self, uid: int | None, user_files: tuple[str, ...]) -> None:
        try:
            files.private_mkdir(self.path, DIR_MODE)
        except files.WrongOwner:
            self._move_aside("its folder is not root's")
            files.private_mkdir(self.path, DIR_MODE)
            return
        if uid is None or os.geteuid() != 0:
            return
        for name in {USER_EVENTS, *user_files}:
            try:
                info = os.lstat(self.path / name)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
                # The same job id, an earlier job of another user (Slurm's ids wrap, or
                # its state was reset): nothing of theirs may reach this job.
                self._move_aside(f"{name} belongs to uid {info.st_uid}, not {uid}")
                files.private_mkdir(self.path, DIR_MODE)
                return

    def _move_aside(self, why: str) -> None:
        from wrapper import log

        jobs = self.state_dir / "jobs"
        aside = f".stale-{self.job_id}-{os.urandom(4).hex()}"
        fd = os.open(jobs, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            with contextlib.suppress(FileNotFoundError):  # another node's prolog did it
                os.rename(self.job_id, aside, src_dir_fd=fd, dst_dir_fd=fd)
            log.get().warning("state.stale_job_dir", path=str(self.path), why=why)
            with contextlib.suppress(OSError):  # fd-based: never follows a symlink in it
                import shutil  # only for a stale folder: not on every prolog's path

                shutil.rmtree(aside, dir_fd=fd)
        finally:
            os.close(fd)

    def _make_user_file(self, name: str, uid: int, gid: int | None) -> None:
        """Create ``name`` owned by the job user (0600), appearing only once it is theirs.

        Made under a private name, chowned by descriptor, then hard-linked into place:
        another node's prolog sharing this state_dir never sees it half made.
        """
        user_file = self.path / name
        tmp = self.path / f".{name}.{os.getpid()}.new"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     FILE_MODE)
        try:
            files.chown_fd(fd, uid, gid if gid is not None else -1)
        finally:
            os.close(fd)
        try:
            os.link(tmp, user_file)
        except FileExistsError:
            info = os.lstat(user_file)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
                raise StateError(f"{user_file} exists but is not a regular file owned by "
                                 f"uid {uid}") from None
        finally:
            os.unlink(tmp)

    def _make_root_file(self, name: str, reader: int) -> None:
        fd = files.open_regular(self.path / name, os.O_WRONLY | os.O_CREAT, FILE_MODE)
        try:
            if os.fstat(fd).st_uid == os.geteuid():
                os.fchmod(fd, FILE_MODE)
                files.grant_read(fd, reader)
        finally:
            os.close(fd)

    def job_uid(self) -> int | None:
        """The job's user, as the owner of its user file says (root made it so)."""
        try:
            uid = os.lstat(self.path / USER_EVENTS).st_uid
        except OSError:
            return None
        return uid if uid != 0 else None

    def append(self, event: str, *, as_user: bool = False, **data: Any) -> dict[str, Any]:
        """Append one event; returns the record written."""
        record = {"ts": time.time(), "event": event, **data}
        line = _line(record)
        name = USER_EVENTS if as_user else ROOT_EVENTS
        path = self.path / name
        try:
            done = files.append_line(path, line, sync=True,
                                     cap=self.user_events_max if as_user else None,
                                     create_mode=None if as_user else FILE_MODE,
                                     lock_path=None if as_user else self.path / ROOT_LOCK)
        except files.UnsafeFileError as exc:
            raise StateError(str(exc)) from None
        except OSError as exc:
            raise StateError(f"cannot append to {path}: {_why(exc)}") from None
        if done == "missing":
            raise StateError(f"{path} does not exist (the prolog creates it; did it run on "
                             "this node?)")
        if done == "full" and str(path) not in _warned_full:
            from wrapper import log

            _warned_full.add(str(path))
            log.get().warning("state.user_events_full", path=str(path),
                              cap=self.user_events_max, dropped=event)
        return record

    def write_json(self, name: str, data: dict[str, Any]) -> None:
        """Replace ``name`` in the job directory atomically (root's records, 0600, the
        job's user granted read)."""
        self.write_bytes(name, json.dumps(data, default=str, indent=1).encode())

    def write_bytes(self, name: str, data: bytes) -> None:
        """Replace ``name`` in the job directory atomically (root's file, 0600, the job's
        user granted read)."""
        if "/" in name or name.startswith("."):
            raise StateError(f"bad state file name {name!r}")
        path = self.path / name
        try:
            files.atomic_write(path, data, mode=FILE_MODE)
            reader = self.job_uid()
            if reader is not None and os.geteuid() == 0:
                fd = files.open_regular(path)
                try:
                    files.grant_read(fd, reader)
                finally:
                    os.close(fd)
        except (OSError, files.UnsafeFileError) as exc:
            raise StateError(f"cannot write {path}: "
                             f"{_why(exc) if isinstance(exc, OSError) else exc}") from None

    def read_bytes(self, name: str, bound: int = ROOT_EVENTS_MAX) -> bytes | None:
        """The last ``bound`` bytes of ``name`` (no-follow, regular files only), or None."""
        try:
            return files.read_tail(self.path / name, bound)
        except (OSError, files.UnsafeFileError):
            return None

    def read_json(self, name: str) -> dict[str, Any] | None:
        raw = self.read_bytes(name)
        if raw is None:
            return None
        return jsontext.loads_object(raw, max_bytes=len(raw))

    def events(self, *, root_only: bool = False, user_only: bool = False
               ) -> list[dict[str, Any]]:
        """Every event of the job, root's and the user's, in time order; with
        ``root_only``, root's alone (the user's file is then not even read: a watcher's
        or supervisor's per-tick look costs nothing of what the user wrote).

        User events carry ``"source": "user"``: they say what the job's user could write.
        Of the user's file only the last ``user_events_max`` bytes are read. A line of a
        newer format (``EVENTS_FORMAT``) in root's file raises FormatTooNew; in the user's
        it is skipped.
        """
        out: list[dict[str, Any]] = []
        files = [] if user_only else [(ROOT_EVENTS, "root", ROOT_EVENTS_MAX, jsontext.MAX_LINE)]
        if not root_only:
            files.append((USER_EVENTS, "user", self.user_events_max, USER_LINE_MAX))
        for name, source, bound, line_max in files:
            for record in _read_lines(self.path / name, bound, line_max):
                if FORMAT_KEY in record and not _readable(record, self.path / name, source):
                    continue
                record["source"] = source
                out.append(record)
        out.sort(key=lambda r: _ts(r.get("ts")))
        return out

    def prune_user_files(self, names: tuple[str, ...] = (USER_EVENTS,)) -> None:
        """After the job: drop what its user could write; root's record stays."""
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path / name)


PRUNE_STAMP = ".user-files-pruned"
PRUNE_EVERY = 3600.0


def prune_stale_user_files(state_dir: Path, max_age: float, now: float) -> int:
    """Drop the user-writable files of jobs whose root record is older than ``max_age``.

    Age is the mtime of root's ``events.jsonl`` (the job's last root event), which the
    user cannot set. Runs at most once per ``PRUNE_EVERY`` per state_dir (a root-owned
    stamp), so an epilog pays for a scan of the jobs folder about once an hour. Returns
    the number of jobs pruned.
    """
    jobs = state_dir / "jobs"
    stamp = jobs / PRUNE_STAMP
    try:
        info = os.lstat(stamp)
        if stat.S_ISREG(info.st_mode) and now - info.st_mtime < PRUNE_EVERY:
            return 0
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise StateError(f"cannot read {stamp}: {_why(exc)}") from None
    try:
        files.atomic_write(stamp, b"", mode=FILE_MODE)
        entries = list(os.scandir(jobs))
    except (OSError, files.UnsafeFileError) as exc:
        raise StateError(f"cannot prune {jobs}: {exc}") from None
    pruned = 0
    for entry in entries:
        if not _JOB_ID.match(entry.name) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            last = os.lstat(Path(entry.path) / ROOT_EVENTS).st_mtime
        except OSError:
            continue
        if now - last > max_age and os.path.lexists(Path(entry.path) / USER_EVENTS):
            JobState(state_dir, entry.name).prune_user_files()
            pruned += 1
    return pruned


def for_job(cfg: Config, job_id: str) -> JobState:
    """The state of ``job_id`` under the configured state_dir, with the configured cap."""
    return JobState(Path(cfg.paths.state_dir), job_id,
                    user_events_max=cfg.hooks.user_events_max)


def _read_lines(path: Path, bound: int, line_max: int = jsontext.MAX_LINE
                ) -> Iterator[dict[str, Any]]:
    try:
        raw = files.read_tail(path, bound + 1)
    except (OSError, files.UnsafeFileError):
        return
    lines = raw.split(b"\n")
    if len(raw) > bound:
        lines = lines[1:]  # started mid-line: older than the bound, ignored
    for line in lines:
        if not line.strip():
            continue
        # a line cut by a crash, or any content a user wrote, is skipped, never fatal
        record = jsontext.loads_object(line, max_bytes=line_max)
        if record is not None:
            yield record


FIELD_MAX = 8192  # characters of one string in an event (a path, a reason, a label)
ITEMS_MAX = 1024  # items of one list or object in an event
LINE_MAX = 256 << 10  # bytes of one event line, all fields together
_CORE = ("v", "ts", "event", "attempt", "node", "hook", "kind", "decision", "pid")


def _line(record: dict[str, Any]) -> bytes:
    """One event as its JSON line, every field bounded: what a user's input reached
    (an output line, a path, a rank's label) cannot grow the file past ``LINE_MAX`` a
    line, and past that the event keeps its core fields and says it was cut."""
    for field_max, items_max in ((FIELD_MAX, ITEMS_MAX), (256, 64)):
        bounded = _bounded(record, field_max, items_max, 0)
        line = (json.dumps(bounded, default=str, separators=(",", ":"), allow_nan=False)
                + "\n").encode()
        if len(line) <= LINE_MAX:
            return line
    core = {k: _bounded(record[k], 256, 8, 0) for k in _CORE if k in record}
    return (json.dumps({**core, "cut": True}, default=str, separators=(",", ":"))
            + "\n").encode()


def _bounded(value: Any, field_max: int, items_max: int, depth: int) -> Any:
    if isinstance(value, str):
        return value if len(value) <= field_max else value[:field_max] + "...[cut]"
    if depth >= 8 and isinstance(value, dict | list | tuple):
        return _bounded(str(value)[:field_max + 1], field_max, items_max, depth)
    if isinstance(value, dict):
        return {str(k)[:256]: _bounded(v, field_max, items_max, depth + 1)
                for k, v in list(value.items())[:items_max]}
    if isinstance(value, list | tuple):
        return [_bounded(v, field_max, items_max, depth + 1) for v in value[:items_max]]
    # What jsontext reads back: a number it would refuse would drop the whole event
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 990:
        return "(a number too large to record)"
    return value


def _readable(record: dict[str, Any], path: Path, source: str) -> bool:
    """A line of a format this jobwrap reads. A newer one in root's file raises
    FormatTooNew (its facts cannot be skipped: the decisions read them); in the user's, it
    is skipped like any line no reader can take (the user could write any number there)."""
    try:
        format_of(record, FORMAT_KEY, known=EVENTS_FORMAT, path=path, what="event line")
    except FormatTooNew:
        if source == "root":
            raise
        return False
    return True


def _ts(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)
