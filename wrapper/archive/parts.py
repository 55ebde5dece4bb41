"""Reading a job's archive parts: the names the archive allows, and each node's part of
each attempt (``<archive_root>/<user>/<jobid>/attempt-<N>/<node>/part.json``). The
lightest of the archive's modules: the prolog of a requeued attempt reads the parts
(``carry``) without loading the writer. The layout and how it is written:
``wrapper/archive/store.py``.
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Callable
from typing import Any

from wrapper.archive._fs import ArchiveError, entries, open_dir, open_root, read_json
from wrapper.errors import format_of

PART = "part.json"
PART_FORMAT = 1  # a part's "format" (docs/upgrades.md); absent: 1
# Root's verdicts of a part's attempt on its node (archive/carry.py), beside part.json:
# small and bounded, so that the next attempt's prolog never reads a part whole.
VERDICTS = "verdicts.json"
VERDICTS_MAX_BYTES = 64 << 10
VERDICTS_MAX = 64  # records in one file: the newest kept
_JOB_ID = re.compile(r"^[0-9]{1,12}$")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._@-]{0,127}$")  # user and node names
_ATTEMPT = re.compile(r"^attempt-([0-9]{1,6})$")


def check_name(what: str, name: str) -> str:
    if not _NAME.match(name):
        raise ArchiveError(f"{what} {name!r} cannot name a folder of the archive")
    return name


def check_job_id(job_id: str) -> str:
    if not _JOB_ID.match(job_id):
        raise ArchiveError(f"{job_id!r} is not a job id")
    return job_id


def read_parts(job_fd: int, where: str = "") -> list[dict[str, Any]]:
    """Every part's record below a job folder (or a temporary one); FormatTooNew for a
    part a newer jobwrap wrote (``where``: the folder, for its message)."""
    parts = []
    for attempt_entry in entries(job_fd):
        match = _ATTEMPT.match(attempt_entry.name)
        if not match or not attempt_entry.is_dir(follow_symlinks=False):
            continue
        attempt_fd = open_dir(job_fd, attempt_entry.name)
        try:
            for node_entry in entries(attempt_fd):
                if not _NAME.match(node_entry.name) or not node_entry.is_dir(
                        follow_symlinks=False):
                    continue
                node_fd = open_dir(attempt_fd, node_entry.name)
                try:
                    part = read_json(node_fd, PART)
                finally:
                    os.close(node_fd)
                if part is not None:
                    format_of(part, "format", known=PART_FORMAT, what="archive part",
                              path=os.path.join(where or "<job folder>", attempt_entry.name,
                                                node_entry.name, PART))
                    part.pop("format", None)
                    parts.append({**part, "attempt": int(match.group(1)),
                                  "node": node_entry.name})
        finally:
            os.close(attempt_fd)
    return sorted(parts, key=lambda p: (p["attempt"], p["node"]))


def users(root_fd: int, user: str | None) -> list[str]:
    if user is not None:
        return [check_name("user", user)]
    try:
        return sorted(e.name for e in entries(root_fd)
                      if _NAME.match(e.name) and e.is_dir(follow_symlinks=False))
    except OSError:
        # A user may not list the root (0711), only reach their own folder.
        try:
            return [pwd.getpwuid(os.getuid()).pw_name]
        except KeyError:
            return []


def find_job(root_fd: int, job_id: str, user: str | None) -> tuple[str, int]:
    for user_name in users(root_fd, user):
        try:
            user_fd = open_dir(root_fd, user_name)
        except (PermissionError, FileNotFoundError):
            continue
        try:
            return user_name, open_dir(user_fd, job_id)
        except (PermissionError, FileNotFoundError):
            continue
        finally:
            os.close(user_fd)
    raise ArchiveError(f"no archive of job {job_id}" + (f" for user {user}" if user else "")
                       + " (or none you may read)")


def load_parts(root: str, job_id: str, user: str | None = None) -> list[dict[str, Any]]:
    """Every part of a job's archive (each node's of each attempt); ArchiveError when
    there is no archive of it the caller can read."""
    root_fd = open_root(root, create=False)
    try:
        owner, job_fd = find_job(root_fd, check_job_id(job_id), user)
        try:
            return read_parts(job_fd, os.path.join(root, owner, job_id))
        finally:
            os.close(job_fd)
    finally:
        os.close(root_fd)


def load_verdicts(root: str, job_id: str, user: str, *, before: int, attempts: int,
                  deadline: float, clock: Callable[[], float]) -> list[dict[str, Any]]:
    """The verdict records of the job's ``attempts`` newest attempts below ``before``,
    every node's (each file bounded; files past the deadline, too large, unreadable or of
    a newer format are left out: what is read is always root's, never more than this)."""
    root_fd = open_root(root, create=False)
    try:
        _owner, job_fd = find_job(root_fd, check_job_id(job_id), check_name("user", user))
    finally:
        os.close(root_fd)
    found: list[dict[str, Any]] = []
    try:
        numbers = sorted((int(m.group(1)) for e in entries(job_fd)
                          if (m := _ATTEMPT.match(e.name)) and e.is_dir(follow_symlinks=False)
                          and int(m.group(1)) < before), reverse=True)[:attempts]
        for number in numbers:
            attempt_fd = open_dir(job_fd, f"attempt-{number}")
            try:
                for node in entries(attempt_fd):
                    if clock() > deadline:
                        return found
                    if not _NAME.match(node.name) or not node.is_dir(follow_symlinks=False):
                        continue
                    node_fd = open_dir(attempt_fd, node.name)
                    try:
                        data = read_json(node_fd, VERDICTS, max_bytes=VERDICTS_MAX_BYTES)
                    finally:
                        os.close(node_fd)
                    if data is not None and data.get("format", 1) == PART_FORMAT:
                        found += [r for r in data.get("records") or [] if isinstance(r, dict)]
            finally:
                os.close(attempt_fd)
    finally:
        os.close(job_fd)
    return found
