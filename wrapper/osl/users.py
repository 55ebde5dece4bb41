"""Who a job's user is, and how a process becomes that user for good."""

from __future__ import annotations

import os
import pwd

from wrapper.errors import JobwrapError
from wrapper.fastdataclass import dataclass

_PR_GET_DUMPABLE, _PR_SET_DUMPABLE = 3, 4


class AsUserError(JobwrapError):
    """Acting with a user's rights failed; the message says how."""


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


def not_dumpable() -> None:
    """Keep the user's other processes from ptrace or /proc/<pid>/fd of this one."""
    import ctypes  # only where a hook acts as the user: not on the quiet prolog's path

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 or \
            libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise AsUserError("could not mark the process non-dumpable")
