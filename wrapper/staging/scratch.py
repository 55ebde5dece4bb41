"""Per-job scratch on the node's local disk: made for the job's user, removed safely.

``prepare_scratch`` (root, prolog) makes ``<scratch_root>/<jobid>`` owned by the user,
mode 0700, and refuses a symlink or anything not ours in its place. ``remove_scratch``
(root, epilog) deletes a tree the user controlled until a moment ago, so it must never
be steered out of it: every folder is opened from its parent's descriptor with
``O_NOFOLLOW``, every entry is unlinked relative to that descriptor, a symlink is only
ever unlinked (whatever it points to, even ``/``), and a folder on another file system
(``st_dev`` differs) or listed as a mount point is left alone, with its contents. A user
can thus make root delete only what the user could have deleted.

``quarantine_scratch`` (root, epilog) keeps a scratch whose results did not all come back
(a stage-out into a full or unwritable DEST): it is moved, not copied, to
``<scratch_root>/.quarantine/<jobid>/attempt<N>`` (the two folders above it root's, mode
0711; the results themselves the user's, mode 0700: only root and the job's user read
them), and ``prune_quarantine`` removes what has been kept longer than the retention.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING

from wrapper.lean import dataclass
from wrapper.osl.files import UnsafeFileError, owned_alone, require_owned_alone
from wrapper.staging.errors import StagingError
from wrapper.staging.fdtree import DIR_FLAGS, open_dir, raise_fd_limit

if TYPE_CHECKING:
    from wrapper.osl.users import UserIds

_JOB_ID = re.compile(r"^[0-9]{1,12}$")
SCRATCH_MODE = 0o700
ROOT_MODE = 0o711  # users reach their own job's folder, and cannot list the others
QUARANTINE = ".quarantine"


@dataclass
class Removal:
    """What removing a tree did; ``left`` holds what it would not touch (mount points)."""

    path: str
    existed: bool = True
    files: int = 0
    dirs: int = 0
    left: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.left


def prepare_scratch(root: Path, job_id: str, user: UserIds) -> Path:
    """Make ``root/job_id`` for ``user`` (mode 0700) and return it.

    A folder left there by an earlier attempt of the same job on this node (its epilog
    did not finish) is ours: it is removed and made afresh, so every attempt starts
    clean. A symlink, or anything owned by someone else, is refused.
    """
    if not _JOB_ID.match(job_id):
        raise StagingError(f"{job_id!r} is not a job id; refusing to use it in a path")
    euid = os.geteuid()
    if euid != 0 and user.uid != euid:
        raise StagingError(f"making scratch for {user.describe()} needs root")
    root_fd = _open_scratch_root(root)
    try:
        path = root / job_id
        try:
            os.mkdir(job_id, SCRATCH_MODE, dir_fd=root_fd)
        except FileExistsError:
            info = os.stat(job_id, dir_fd=root_fd, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                raise StagingError(f"{path} is a symlink; refusing to use it as scratch "
                                   "(remove it by hand after a look)") from None
            if not stat.S_ISDIR(info.st_mode) or info.st_uid not in (user.uid, euid):
                raise StagingError(f"{path} exists and is not a scratch folder of this job "
                                   f"(owner uid {info.st_uid}); refusing to use it") from None
            removal = remove_tree(root_fd, job_id, display=str(path))
            if removal.left:
                raise StagingError(f"{path} from an earlier attempt cannot be cleared: "
                                   f"{', '.join(removal.left)} left in place") from None
            os.mkdir(job_id, SCRATCH_MODE, dir_fd=root_fd)
        fd = os.open(job_id, DIR_FLAGS, dir_fd=root_fd)
        try:
            info = os.fstat(fd)
            if info.st_uid != euid:  # someone swapped it between mkdir and open
                raise StagingError(f"{path} changed while it was being made; refusing it")
            if euid == 0:
                os.fchown(fd, user.uid, user.gid)
            os.fchmod(fd, SCRATCH_MODE)
        finally:
            os.close(fd)
        return path
    finally:
        os.close(root_fd)


def remove_scratch(path: Path) -> Removal:
    """Remove a job's scratch folder and everything in it, never leaving it (see above).

    A symlink in the folder's own place is unlinked, and what it points to is kept.
    """
    path = Path(os.path.abspath(path))
    try:
        parent_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return Removal(str(path), existed=False)
    try:
        return remove_tree(parent_fd, path.name, display=str(path))
    finally:
        os.close(parent_fd)


def remove_tree(parent_fd: int, name: str, *, display: str | None = None) -> Removal:
    """Remove ``name`` inside the folder ``parent_fd`` without following symlinks or
    crossing into another mount. Iterative: a deep tree costs descriptors, not stack."""
    shown = display or name
    removal = Removal(shown)
    try:
        info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        removal.existed = False
        return removal
    if not stat.S_ISDIR(info.st_mode):
        _unlink(parent_fd, name, removal)
        return removal
    raise_fd_limit()
    try:
        top = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped for a link or a file
            _unlink(parent_fd, name, removal)
            return removal
        raise
    device = os.fstat(top).st_dev
    mounts = _mount_points_under(_real(parent_fd, name))
    # frames: (descriptor, name in parent, path shown, names still to visit)
    stack: list[tuple[int, str, str, list[str]]] = []
    _push(stack, top, name, "", removal)
    try:
        while stack:
            fd, own, rel, pending = stack[-1]
            if pending:
                entry = pending.pop()
                _visit(stack, fd, entry, f"{rel}/{entry}" if rel else entry, device, mounts,
                       removal)
                continue
            stack.pop()
            os.close(fd)
            parent = stack[-1][0] if stack else parent_fd
            try:
                os.rmdir(own, dir_fd=parent)
                removal.dirs += 1
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EBUSY):
                    raise
                # something in it was left (a mount); already listed in removal.left
    finally:
        for fd, _, _, _ in stack:
            os.close(fd)
    return removal


def _visit(stack: list[tuple[int, str, str, list[str]]], fd: int, name: str, rel: str,
           device: int, mounts: set[str], removal: Removal) -> None:
    try:
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        _unlink(fd, name, removal)
        return
    if info.st_dev != device or rel in mounts:
        removal.left.append(rel)
        return
    try:
        child = os.open(name, DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # swapped under us: unlink the link
            _unlink(fd, name, removal)
            return
        raise
    seen = os.fstat(child)
    if (seen.st_dev, seen.st_ino) != (info.st_dev, info.st_ino):  # swapped for a mount
        os.close(child)
        removal.left.append(rel)
        return
    _push(stack, child, name, rel, removal)


def _push(stack: list[tuple[int, str, str, list[str]]], fd: int, name: str, rel: str,
          removal: Removal) -> None:
    try:
        if os.geteuid() != 0 and os.fstat(fd).st_mode & 0o700 != 0o700:
            with contextlib.suppress(PermissionError):  # not ours: unlinks will say so
                os.fchmod(fd, 0o700)  # our own read-only folder (a dataset's): open it up
        names = os.listdir(fd)
    except BaseException:
        os.close(fd)
        raise
    stack.append((fd, name, rel, names))


def _unlink(fd: int, name: str, removal: Removal) -> None:
    try:
        os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StagingError(f"cannot remove {name!r} from {removal.path}: {exc.strerror}") \
            from None
    removal.files += 1


def _real(parent_fd: int, name: str) -> str:
    with contextlib.suppress(OSError):
        return os.path.join(os.readlink(f"/proc/self/fd/{parent_fd}"), name)
    return ""


def _mount_points_under(top: str) -> set[str]:
    """Mount points strictly inside ``top`` (relative to it), from /proc/self/mountinfo.

    ``st_dev`` already stops at other file systems; this also catches a bind mount of
    the same file system, which ``st_dev`` cannot tell apart.
    """
    found: set[str] = set()
    if not top:
        return found
    prefix = top.rstrip("/") + "/"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                fields = line.split(" ")
                if len(fields) > 4:
                    point = _unescape(fields[4])
                    if point.startswith(prefix):
                        found.add(point[len(prefix):])
    except OSError:
        pass
    return found


def _unescape(text: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def _open_scratch_root(root: Path) -> int:
    """Open (making if needed) the scratch root; it must be root's and not open to all."""
    try:
        os.mkdir(root, ROOT_MODE)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StagingError(f"cannot make the scratch root {root}: {exc.strerror}") from None
    try:
        fd = open_dir(root)
    except OSError as exc:
        raise StagingError(f"cannot open the scratch root {root}: {exc.strerror} (is it a "
                           "symlink? set paths.scratch_root to the real folder)") from None
    return _ours_alone(fd, f"the scratch root {root}")


def quarantine_scratch(root: Path, job_id: str, name: str) -> Path | None:
    """Move ``root/job_id`` to ``root/.quarantine/job_id/name`` (or ``name.1``, ...).

    Returns where it is now; None when there is no scratch folder to keep (nothing, or
    a symlink or a file in its place, which the caller removes as usual). The move is a
    rename on the same file system: nothing is copied, nothing can be half kept.
    """
    if not _JOB_ID.match(job_id) or "/" in name or name.startswith("."):
        raise StagingError(f"bad quarantine name {job_id!r}/{name!r}")
    root_fd = _open_scratch_root(root)
    try:
        try:
            info = os.stat(job_id, dir_fd=root_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(info.st_mode):
            return None
        box_fd = _root_dir(root_fd, QUARANTINE, str(root / QUARANTINE))
        try:
            job_fd = _root_dir(box_fd, job_id, str(root / QUARANTINE / job_id))
            try:
                target, number = name, 0
                while _exists(job_fd, target):
                    number += 1
                    target = f"{name}.{number}"
                try:
                    os.rename(job_id, target, src_dir_fd=root_fd, dst_dir_fd=job_fd)
                except OSError as exc:
                    raise StagingError(f"cannot move {root / job_id} to "
                                       f"{root / QUARANTINE / job_id / target}: "
                                       f"{exc.strerror}") from None
                kept = os.open(target, DIR_FLAGS, dir_fd=job_fd)
                try:
                    os.fchmod(kept, SCRATCH_MODE)  # only its owner (the job's user) and root
                finally:
                    os.close(kept)
                os.utime(job_fd)  # the retention counts from now
            finally:
                os.close(job_fd)
        finally:
            os.close(box_fd)
        return root / QUARANTINE / job_id / target
    finally:
        os.close(root_fd)


def prune_quarantine(root: Path, max_age: float, now: float) -> list[str]:
    """Remove every kept job folder older than ``max_age`` seconds; returns their names.

    Age is the mtime of ``.quarantine/<jobid>``, root's folder, which the user cannot
    change. Never creates the quarantine; removal never leaves it (``remove_tree``).
    """
    try:
        root_fd = open_dir(root)
    except OSError:
        return []
    removed: list[str] = []
    try:
        try:
            box_fd = open_dir(QUARANTINE, dir_fd=root_fd)
        except OSError:
            return []
        try:
            if not owned_alone(os.fstat(box_fd)):
                raise StagingError(f"{root / QUARANTINE} is not root's own folder; "
                                   "refusing to prune it (remove it by hand after a look)")
            for entry in os.listdir(box_fd):
                try:
                    seen = os.stat(entry, dir_fd=box_fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if _JOB_ID.match(entry) and seen.st_mtime + max_age <= now:
                    remove_tree(box_fd, entry, display=str(root / QUARANTINE / entry))
                    removed.append(entry)
        finally:
            os.close(box_fd)
    finally:
        os.close(root_fd)
    return removed


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _root_dir(parent_fd: int, name: str, shown: str) -> int:
    """Open (making, mode 0711) a folder of ours: no symlink, no one else's, not writable
    by others."""
    try:
        os.mkdir(name, ROOT_MODE, dir_fd=parent_fd)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StagingError(f"cannot make {shown}: {exc.strerror}") from None
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        raise StagingError(f"cannot open {shown}: {exc.strerror} (a symlink or a file in "
                           "its place? remove it after a look)") from None
    return _ours_alone(fd, shown)


def _ours_alone(fd: int, shown: str) -> int:
    """``fd`` if its folder is ours and writable by us alone; else closed, StagingError."""
    try:
        require_owned_alone(fd, shown)
    except UnsafeFileError as exc:
        os.close(fd)
        raise StagingError(str(exc)) from None
    return fd
