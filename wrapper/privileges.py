"""Run a function with a job user's rights, from a root hook.

Root hooks must never open a path the job user controls with root's rights (a symlink
in the user's folder would make root read or write anything). ``as_user`` forks, drops
to the user's uid, gid and supplementary groups in the child, runs the function there
and sends its result (or its error) back through a pipe as JSON. When the caller is
not root, or already is that user, the function simply runs in-process.
"""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wrapper.errors import JobwrapError


class AsUserError(JobwrapError):
    """The function run with the user's rights failed; the message is its error."""


@dataclass(frozen=True)
class UserIds:
    """The identity whose rights a root hook borrows: a job's user, with their groups."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    @classmethod
    def for_job(cls, name: str, uid: int, gid: int) -> UserIds:
        """From what Slurm says (SLURM_JOB_USER/UID/GID); groups from the name service."""
        try:
            groups = os.getgrouplist(name, gid) if name else [gid]
        except (KeyError, OSError):
            groups = [gid]
        return cls(name=name or str(uid), uid=uid, gid=gid, groups=tuple(sorted(set(groups))))

    @classmethod
    def of(cls, uid: int, gid: int | None = None) -> UserIds:
        """From a uid alone (the name and default group from the password database)."""
        try:
            entry = pwd.getpwuid(uid)
        except KeyError:
            return cls.for_job("", uid, gid if gid is not None else uid)
        return cls.for_job(entry.pw_name, uid, gid if gid is not None else entry.pw_gid)

    @classmethod
    def lookup(cls, name: str) -> UserIds:
        entry = pwd.getpwnam(name)
        return cls.for_job(name, entry.pw_uid, entry.pw_gid)

    @classmethod
    def current(cls) -> UserIds:
        uid = os.geteuid()
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = str(uid)
        return cls(name=name, uid=uid, gid=os.getegid(),
                   groups=tuple(sorted({os.getegid(), *os.getgroups()})))

    def describe(self) -> str:
        import grp

        try:
            group = grp.getgrgid(self.gid).gr_name
        except KeyError:
            group = str(self.gid)
        return f"{self.name} (uid {self.uid}, gid {self.gid} {group})"


def drop_to(user: UserIds) -> None:
    """Become ``user`` for good: groups, then gid, then uid (the order that still works),
    then prove root cannot be had back. A no-op for a process that already is ``user``."""
    if os.geteuid() == 0 and user.uid != 0:
        os.setgroups(list(user.groups))
        os.setresgid(user.gid, user.gid, user.gid)
        os.setresuid(user.uid, user.uid, user.uid)
        if os.getresuid() != (user.uid,) * 3 or os.getresgid() != (user.gid,) * 3:
            raise AsUserError(f"could not drop to {user.describe()}")
        try:
            os.setuid(0)
        except PermissionError:
            return
        raise AsUserError(f"could get root back after dropping to {user.describe()}")
    if os.geteuid() != user.uid:
        raise AsUserError(f"acting as {user.describe()} needs root; this runs as uid "
                          f"{os.geteuid()}")


def as_user(user: UserIds, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with ``user``'s rights; its result must be JSON-serialisable."""
    if os.geteuid() != 0 or os.geteuid() == user.uid:
        return fn(*args)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop rights for good, then run
        code = 0
        try:
            os.close(read_fd)
            drop_to(user)
            try:
                payload = {"ok": fn(*args)}
            except OSError as exc:
                payload = {"error": f"{exc.strerror}: {exc.filename}" if exc.filename
                           else str(exc)}
            except Exception as exc:
                payload = {"error": str(exc) or type(exc).__name__}
            data = json.dumps(payload, default=str).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(write_fd, view):]
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    chunks = []
    with os.fdopen(read_fd, "rb") as pipe:
        while chunk := pipe.read(65536):
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        raise AsUserError(f"the helper process running as {user.name} died "
                          f"(wait status {status})")
    result = json.loads(b"".join(chunks))
    if "error" in result:
        raise AsUserError(str(result["error"]))
    return result["ok"]


# -- small file operations that hooks run through as_user --------------------------------
def read_tail(path: str, max_bytes: int = 65536) -> str:
    """The last ``max_bytes`` of a file, decoded leniently; "" if it does not exist."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - max_bytes))
            return handle.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def append_line(path: str, line: str) -> bool:
    """Append one line to an existing file (the job's output); False if it is not there."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        os.write(fd, (line.rstrip("\n") + "\n").encode())
    finally:
        os.close(fd)
    return True
