"""Who can read the archive, as ``jobwrap doctor`` explains it (``[archive] access``).

``user`` (the default) shows a job's logs to its user alone (a POSIX ACL entry on
root-owned files), which needs a file system with ACLs. ``group`` shows them to the job
user's whole primary group: safe only while no two users share one, which is what the
doctor looks for in the name service.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import secrets
from collections.abc import Iterable

from wrapper.config import Config
from wrapper.errors import JobwrapError

_SYSTEM_UID = 1000  # accounts below this are system accounts (as login_guard.min_uid)
_NOBODY = 65534
_SHOWN = 5


def shared_groups(users: Iterable[pwd.struct_passwd],
                  groups: Iterable[grp.struct_group]) -> dict[str, list[str]]:
    """Each group that is some user's primary group and that more than one user is in
    (by primary gid or as a listed member): group name -> its users, sorted."""
    members: dict[int, set[str]] = {}
    for entry in users:
        if _SYSTEM_UID <= entry.pw_uid != _NOBODY:
            members.setdefault(entry.pw_gid, set()).add(entry.pw_name)
    names = {}
    for group in groups:
        names[group.gr_gid] = group.gr_name
        if group.gr_gid in members:
            members[group.gr_gid].update(group.gr_mem)
    return {names.get(gid, str(gid)): sorted(who) for gid, who in members.items()
            if len(who) > 1}


def check(cfg: Config) -> tuple[str, str, str]:
    """(status, detail, fix) of the archive's access setting on this node."""
    settings = cfg.archive
    if settings.access == "group":
        shared = shared_groups(pwd.getpwall(), grp.getgrall())
        fix = ('set [archive] access = "user" (the job\'s user alone reads its archive; needs '
               'ACLs on the archive\'s file system)')
        if shared:
            listed = "; ".join(f"{name}: {', '.join(who[:_SHOWN])}"
                               f"{f' and {len(who) - _SHOWN} more' if len(who) > _SHOWN else ''}"
                               for name, who in sorted(shared.items())[:_SHOWN])
            return ("warn", f'access = "group" shows each job\'s archived logs to every user '
                    f"of the job user's primary group, and users share one here ({listed})",
                    fix)
        return ("warn", 'access = "group" shows each job\'s archived logs to every user of '
                "the job user's primary group; no user listed by the name service shares "
                "one now, but any that is added (or that the name service does not "
                "enumerate) will read the others' logs", fix)
    try:
        grp.getgrnam(settings.admin_group)
    except KeyError:
        return ("fail", f"[archive] admin_group {settings.admin_group!r} is not a group on "
                "this node: no archive can be written", "create the group or set "
                "[archive] admin_group to one that exists")
    problem = _acl_problem(cfg.paths.archive_root)
    if problem:
        return ("fail", problem, "mount the archive's file system with ACL support, or "
                'set [archive] access = "group" where no two users share a primary group')
    return ("pass", f"access = \"{settings.access}\": each job's archive is read by its "
            f"user (POSIX ACL) and by root and group {settings.admin_group} only", "")


def _acl_problem(root: str) -> str:
    """Why the archive root cannot carry the ACL each job's archive needs ("" if it can)."""
    from wrapper.archive._fs import Access

    if not os.path.isdir(root):
        return ""  # the folder check says it is missing
    name = os.path.join(root, f".doctor-acl-{secrets.token_hex(4)}")
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        return f"cannot try an ACL in {root}: {exc.strerror}"
    try:
        Access(gid=os.getegid(), acl_uid=_NOBODY).apply(fd, is_dir=False)
    except JobwrapError as exc:
        return f"{root}: {exc}"
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name)
    return ""
