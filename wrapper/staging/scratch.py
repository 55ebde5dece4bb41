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

import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from wrapper.osl import dirs
from wrapper.osl.dirs import Removal, exists, open_dir
from wrapper.osl.files import UnsafeFileError, owned_alone, require_owned_alone
from wrapper.staging.errors import StagingError

if TYPE_CHECKING:
    from wrapper.osl.users import UserIds

_JOB_ID = re.compile(r"^[0-9]{1,12}$")
SCRATCH_MODE = 0o700
ROOT_MODE = 0o711  # users reach their own job's folder, and cannot list the others
QUARANTINE = ".quarantine"


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
        fd = open_dir(job_id, dir_fd=root_fd)
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
        parent_fd = open_dir(path.parent, follow=True)  # the admin's scratch root
    except FileNotFoundError:
        return Removal(str(path), existed=False)
    try:
        return remove_tree(parent_fd, path.name, display=str(path))
    finally:
        os.close(parent_fd)


def remove_tree(parent_fd: int, name: str, *, display: str | None = None) -> Removal:
    """``osl.dirs.remove_tree`` (no symlink followed, no mount crossed), an entry that
    cannot be unlinked a StagingError naming it."""
    try:
        return dirs.remove_tree(parent_fd, name, display=display)
    except dirs.Unremovable as exc:
        raise StagingError(f"cannot remove {exc.filename!r} from {display or name}: "
                           f"{exc.strerror}") from None


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
                while exists(job_fd, target):
                    number += 1
                    target = f"{name}.{number}"
                try:
                    os.rename(job_id, target, src_dir_fd=root_fd, dst_dir_fd=job_fd)
                except OSError as exc:
                    raise StagingError(f"cannot move {root / job_id} to "
                                       f"{root / QUARANTINE / job_id / target}: "
                                       f"{exc.strerror}") from None
                kept = open_dir(target, dir_fd=job_fd)
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
        fd = open_dir(name, dir_fd=parent_fd)
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
