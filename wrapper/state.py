"""Per-job state: ``<state_dir>/jobs/<jobid>/``, append-only JSON-lines event records.

Two files, so that what root wrote can always be told from what the job's user wrote:
``events.jsonl`` (root's hooks and the supervisor; owned by root) and
``user-events.jsonl`` (hooks that run as the job user, such as task-prolog; created by
the prolog and owned by that user). Each event is one line written with a single
``write`` on an O_APPEND descriptor under an exclusive lock, then fsynced, so
concurrent writers (two nodes' hooks, several tasks) never interleave or tear a line.
Nothing in the job directory is ever opened through a symlink.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wrapper.errors import StateError

ROOT_EVENTS = "events.jsonl"
USER_EVENTS = "user-events.jsonl"
_JOB_ID = re.compile(r"^[0-9]{1,12}$")
_OPEN_APPEND = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class JobState:
    state_dir: Path
    job_id: str

    def __post_init__(self) -> None:
        if not _JOB_ID.match(self.job_id):
            raise StateError(f"{self.job_id!r} is not a job id; refusing to use it in a path")

    @property
    def path(self) -> Path:
        return self.state_dir / "jobs" / self.job_id

    def prepare(self, uid: int | None, gid: int | None,
                user_files: tuple[str, ...] = (USER_EVENTS,)) -> None:
        """Create the job directory and the files the job user writes (root, idempotent).

        Safe when several nodes' prologs share one state_dir and race: every step
        tolerates the other having done it, and checks what it finds.
        """
        jobs = self.state_dir / "jobs"
        try:
            os.makedirs(self.state_dir.parent, 0o755, exist_ok=True)
        except OSError as exc:
            raise StateError(f"cannot create {self.state_dir.parent}: {exc.strerror}") from None
        _make_private_dir(self.state_dir, 0o755)
        _make_private_dir(jobs, 0o755)
        _make_private_dir(self.path, 0o755)
        if os.geteuid() != 0 or uid is None:
            return
        for name in user_files:
            self._make_user_file(name, uid, gid)

    def _make_user_file(self, name: str, uid: int, gid: int | None) -> None:
        """Create ``name`` owned by the job user, appearing only once it is theirs.

        Made under a private name, chowned, then hard-linked into place: another node's
        prolog sharing this state_dir never sees it half made (still root's).
        """
        user_file = self.path / name
        tmp = self.path / f".{name}.{os.getpid()}.new"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o640)
        try:
            os.fchown(fd, uid, gid if gid is not None else -1)
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

    def append(self, event: str, *, as_user: bool = False, **data: Any) -> dict[str, Any]:
        """Append one event; returns the record written."""
        record = {"ts": time.time(), "event": event, **data}
        line = (json.dumps(record, default=str, separators=(",", ":")) + "\n").encode()
        name = USER_EVENTS if as_user else ROOT_EVENTS
        flags = _OPEN_APPEND if as_user else _OPEN_APPEND | os.O_CREAT
        try:
            fd = os.open(self.path / name, flags, 0o644)
        except FileNotFoundError:
            raise StateError(f"{self.path / name} does not exist (the prolog creates it; "
                             "did it run on this node?)") from None
        except OSError as exc:
            raise StateError(f"cannot open {self.path / name}: {exc.strerror}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise StateError(f"{self.path / name} is not a regular file")
            fcntl.flock(fd, fcntl.LOCK_EX)
            view = memoryview(line)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        return record

    def write_json(self, name: str, data: dict[str, Any]) -> None:
        """Replace ``name`` in the job directory atomically (root's records, mode 0644)."""
        if "/" in name or name.startswith("."):
            raise StateError(f"bad state file name {name!r}")
        tmp = self.path / f".{name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
        try:
            os.write(fd, json.dumps(data, default=str, indent=1).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path / name)

    def read_json(self, name: str) -> dict[str, Any] | None:
        try:
            fd = os.open(self.path / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as handle:
            try:
                data = json.load(handle)
            except ValueError:
                return None
        return data if isinstance(data, dict) else None

    def events(self) -> list[dict[str, Any]]:
        """Every event of the job, root's and the user's, in time order.

        User events carry ``"source": "user"``: they say what the job's user could write.
        """
        out: list[dict[str, Any]] = []
        for name, source in ((ROOT_EVENTS, "root"), (USER_EVENTS, "user")):
            for record in _read_lines(self.path / name):
                record["source"] = source
                out.append(record)
        out.sort(key=lambda r: float(r.get("ts", 0)))
        return out


def _read_lines(path: Path) -> Iterator[dict[str, Any]]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, OSError):
        return
    with os.fdopen(fd, "rb") as handle:
        for raw in handle:
            try:
                record = json.loads(raw)
            except ValueError:
                continue  # a line cut by a crash is skipped, never fatal
            if isinstance(record, dict):
                yield record


def _make_private_dir(path: Path, mode: int) -> None:
    """mkdir that refuses symlinks and directories owned by anyone but us."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    except FileNotFoundError:
        raise StateError(f"cannot create {path}: its parent does not exist") from None
    except PermissionError:
        raise StateError(f"cannot create {path}: permission denied") from None
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise StateError(f"{path} is not a directory (a symlink or a file is in the way)")
    if info.st_uid != os.geteuid():
        raise StateError(f"{path} is owned by uid {info.st_uid}, not by uid {os.geteuid()}")
