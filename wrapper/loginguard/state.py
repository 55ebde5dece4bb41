"""The guard's memory on disk: violation clocks, throttles, pending kills and the audit trail.

One JSON file, ``<state_dir>/login-guard/state.json``, replaced atomically (a new file
written, fsynced and renamed over the old one, then the folder fsynced), so a guard
killed at any moment restarts with every clock where it was. The folder must be ours
and no symlink; the file is never opened through one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import stat
import time
from dataclasses import field
from pathlib import Path
from typing import Any

from wrapper.errors import StateError
from wrapper.fastdataclass import dataclass

STATE_FILE = "state.json"
LOCK_FILE = "guard.lock"
VERSION = 1
# The audit trail kept in the state file for `status`; the log keeps everything.
HISTORY = 500


@dataclass
class Violation:
    """One user breaking one rule, from the first scan that saw it."""

    uid: int
    user: str
    rule: str
    kind: str
    since: float  # when it was first seen: the clock that survives restarts
    last_seen: float
    seen: str = ""
    stage: int = 0  # how many steps of the rule's ladder were taken
    stage_at: float = 0.0
    last_action: str = ""

    @property
    def key(self) -> str:
        return violation_key(self.uid, self.rule)


@dataclass
class Reniced:
    pid: int
    create_time: float
    previous: int


@dataclass
class Throttle:
    """How a user was throttled, so that it can be undone exactly."""

    uid: int
    user: str
    method: str  # "cgroup" (cpu.max) or "renice"
    since: float
    cgroup_file: str = ""
    previous_max: str = ""
    reniced: list[Reniced] = field(default_factory=list)


@dataclass
class PendingKill:
    """A process sent SIGTERM, to get SIGKILL at ``deadline`` if it is still there."""

    pid: int
    create_time: float
    uid: int
    user: str
    rule: str
    deadline: float


@dataclass(frozen=True)
class ActionRecord:
    """One action taken (or, in a dry run, that would have been): the audit record."""

    ts: float
    action: str  # warn, throttle, terminate, kill, unthrottle
    user: str
    uid: int
    rule: str
    pids: tuple[int, ...]
    seen: str
    detail: str
    dry_run: bool
    ok: bool


@dataclass
class GuardState:
    violations: dict[str, Violation] = field(default_factory=dict)
    throttles: dict[int, Throttle] = field(default_factory=dict)
    pending_kills: list[PendingKill] = field(default_factory=list)
    history: list[ActionRecord] = field(default_factory=list)

    def record(self, action: ActionRecord) -> None:
        self.history.append(action)
        del self.history[:-HISTORY]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "violations": [dataclasses.asdict(v) for v in self.violations.values()],
            "throttles": [dataclasses.asdict(t) for t in self.throttles.values()],
            "pending_kills": [dataclasses.asdict(k) for k in self.pending_kills],
            "history": [dataclasses.asdict(a) for a in self.history],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GuardState:
        if data.get("version") != VERSION:
            raise ValueError(f"state version {data.get('version')!r}, expected {VERSION}")
        violations = [Violation(**v) for v in data["violations"]]
        throttles = []
        for t in data["throttles"]:
            reniced = [Reniced(**r) for r in t.get("reniced", [])]
            throttles.append(Throttle(**{**t, "reniced": reniced}))
        return cls(
            violations={v.key: v for v in violations},
            throttles={t.uid: t for t in throttles},
            pending_kills=[PendingKill(**k) for k in data["pending_kills"]],
            history=[ActionRecord(**{**a, "pids": tuple(a["pids"])}) for a in data["history"]],
        )


def violation_key(uid: int, rule: str) -> str:
    return f"{uid}:{rule}"


@dataclass(frozen=True)
class StateStore:
    """Where the guard's state lives; ``load`` and ``save`` are the only ways in and out."""

    directory: Path

    @property
    def path(self) -> Path:
        return self.directory / STATE_FILE

    def load(self) -> tuple[GuardState, str]:
        """The saved state, and a problem ('' if none): a broken file is set aside, not fatal.

        A guard that refused to start over a damaged file would leave the node unguarded;
        the damaged file is kept beside the new one for whoever investigates.
        """
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return GuardState(), ""
        except OSError as exc:
            raise StateError(f"cannot open {self.path}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as handle:
            raw = handle.read()
        try:
            return GuardState.from_json(json.loads(raw)), ""
        except (ValueError, KeyError, TypeError) as exc:
            aside = self.path.with_name(f"{STATE_FILE}.damaged-{int(time.time())}")
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            return GuardState(), f"{self.path} was unreadable ({exc}); set aside as {aside}"

    def save(self, state: GuardState) -> None:
        self.prepare()
        data = (json.dumps(state.to_json(), separators=(",", ":")) + "\n").encode()
        write_atomic(self.path, data, 0o640)

    def prepare(self) -> None:
        """Create the folder (and its parent) if needed, refusing one that is not ours."""
        try:
            os.makedirs(self.directory.parent, 0o755, exist_ok=True)
            os.mkdir(self.directory, 0o755)
        except FileExistsError:
            pass
        except OSError as exc:
            raise StateError(f"cannot create {self.directory}: {exc.strerror}") from None
        info = os.lstat(self.directory)
        if not stat.S_ISDIR(info.st_mode):
            raise StateError(f"{self.directory} is not a directory (a symlink or a file "
                             "is in the way)")
        if info.st_uid != os.geteuid():
            raise StateError(f"{self.directory} is owned by uid {info.st_uid}, not by uid "
                             f"{os.geteuid()}")

    def lock(self) -> int:
        """Hold the guard's lock (one guard per node); returns the descriptor to keep open."""
        self.prepare()
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateError(f"another login guard holds {self.directory / LOCK_FILE}; "
                             "one guard per node") from None
        return fd


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` with ``data`` so that a reader sees the old file or the new, whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # left by a guard that died mid-write; the folder is ours alone
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode)
    except OSError as exc:
        raise StateError(f"cannot write {tmp}: {exc.strerror}") from None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
