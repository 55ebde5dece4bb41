"""Helpers of the staging tests (unit and adversarial) that are not set-up: the hostile
name the dataset holds, stage settings with no free-space margin, job after job staged on
one node, a byte-for-byte digest, a probe run with a user's rights, and the writes a user
tries. Their set-up is fixtures: ``area`` and ``tmpfs`` in tests/conftest.py,
``make_dataset`` and ``jobs`` in tests/unit/conftest.py.

The staging tests run as root (as CI does) against the project's test user ``jwtest``,
because what they prove is what root does on the user's behalf.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from wrapper.staging import (
    Cache,
    StageItem,
    StageSettings,
    UserIds,
    parse_stage_in,
    prepare_scratch,
    stage_in,
)
from wrapper.staging.channel import Channel
from wrapper.staging.privileges import Worker

HOSTILE = "we'ird \"name\"; echo pwned\nline"
SETTINGS = StageSettings(free_margin_bytes=0)

# The types of the make_dataset and tmpfs fixtures.
MakeDataset = Callable[..., Path]
Tmpfs = Callable[..., AbstractContextManager[Path]]


class Jobs:
    """Job after job on one node: each gets its own scratch (the ``jobs`` fixture of
    tests/unit/conftest.py makes one)."""

    def __init__(self, area: Path, user: UserIds) -> None:
        self.area, self.user, self.next_id = area, user, 200

    def scratch(self) -> Path:
        self.next_id += 1
        return prepare_scratch(self.area / "scratch", str(self.next_id), self.user)

    def stage(self, value: str, cache: Cache | None, settings: StageSettings = SETTINGS,
              scratch: Path | None = None) -> tuple[Path, StageItem]:
        scratch = scratch or self.scratch()
        report = stage_in([parse_stage_in(value)], scratch=scratch, user=self.user,
                          cache=cache, settings=settings, timeout=120)
        return scratch, report.items[0]


def digest(root: Path, *, modes: bool = True, mtimes: bool = True,
           resolution_ns: int = 1) -> dict[str, Any]:
    """Everything that must survive staging: kind, content (sha256), link target, mode
    and mtime (to ``resolution_ns``: a tar keeps less than nanoseconds) of every entry
    below ``root``."""
    out: dict[str, Any] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        info = path.lstat()
        row: list[Any] = []
        if stat.S_ISLNK(info.st_mode):
            row = ["link", os.readlink(path)]
        elif stat.S_ISDIR(info.st_mode):
            row = ["dir"]
        else:
            row = ["file", hashlib.sha256(path.read_bytes()).hexdigest()]
        if modes and not stat.S_ISLNK(info.st_mode):
            row.append(oct(stat.S_IMODE(info.st_mode)))
        if mtimes:
            row.append((info.st_mtime_ns + resolution_ns // 2) // resolution_ns)
        out[rel] = row
    return out


def as_user(user: UserIds, probe: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``probe`` in a worker holding only ``user``'s rights; returns what it found."""

    def body(channel: Channel) -> None:
        channel.send({"t": "result", "value": probe()})

    with Worker(user, body, timeout=30) as worker:
        message, fds = worker.recv()
        for fd in fds:
            os.close(fd)
        worker.wait()
    value = message["value"]
    assert isinstance(value, dict)
    return value


def try_write(path: Path) -> dict[str, Any]:
    """What a user gets when they try to change ``path``: an errno name, or 'ok'."""
    result = {}
    for what, action in (("write", lambda: os.open(path, os.O_WRONLY)),
                         ("chmod", lambda: os.chmod(path, 0o666)),  # noqa: S103 - the attack
                         ("truncate", lambda: os.truncate(path, 0))):
        try:
            value = action()
            if isinstance(value, int):
                os.close(value)
            result[what] = "ok"
        except OSError as exc:
            result[what] = exc.__class__.__name__
    return result

