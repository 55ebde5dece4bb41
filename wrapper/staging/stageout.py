"""Stage-out: after the job, copy what it left in scratch to shared storage, as the user.

Whatever happened to the job, everything that exists is copied: a directive whose
source is missing is reported as missing, a file that cannot be written is listed as a
problem, and the others go on. Files are written under a temporary name and renamed
into place, so a reader of DEST never sees half a file; folders already at DEST are
merged into. Nothing here raises for the user's data; the report says it all.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from wrapper.errors import JobwrapError, UserInputError
from wrapper.osl.dirs import DirTree, open_dir, raise_fd_limit
from wrapper.staging import messages as msg
from wrapper.staging.channel import Channel, close_fds
from wrapper.staging.copy import Meter, check_space, copy_tree, space_needed
from wrapper.staging.errors import StagingError, prefixed
from wrapper.staging.privileges import UserIds, Worker
from wrapper.staging.report import ProgressFn, StageItem, StageReport
from wrapper.staging.settings import StageSettings
from wrapper.staging.spec import StageOut
from wrapper.staging.stagein import open_scratch, serialized
from wrapper.staging.tree import SourceTree
from wrapper.staging.worker import reporter, resolve


def stage_out(specs: Sequence[StageOut], *, scratch: Path, user: UserIds,
              settings: StageSettings | None = None, progress: ProgressFn | None = None,
              work_dir: str | None = None, timeout: float | None = None) -> StageReport:
    """Copy each directive's SRC (in scratch) to its DEST with the user's rights."""
    specs = list(specs)
    if not specs:
        return StageReport()
    settings = settings or StageSettings()
    report = serialized(progress)
    try:
        scratch_fd = open_scratch(scratch, user)
    except StagingError as exc:
        if not os.path.lexists(scratch):
            return StageReport(tuple(_missing(s, resolve_or_keep(s.dest, work_dir))
                                     for s in specs))
        return StageReport(tuple(_failed(s, str(exc)) for s in specs))
    items: list[StageItem] = []
    try:
        body = partial(_worker, specs=specs, scratch_fd=scratch_fd, settings=settings,
                       work_dir=work_dir)
        with Worker(user, body, keep_fds=[scratch_fd], timeout=timeout) as worker:
            while True:
                message, fds = msg.receive(worker)
                close_fds(fds)
                if isinstance(message, msg.ProgressNote):
                    if report is not None:
                        report(message.progress)
                elif isinstance(message, msg.ItemDone):
                    items.append(message.item)
                elif isinstance(message, msg.End):
                    break
                else:
                    raise StagingError(f"the staging worker sent an unexpected "
                                       f"{message.KIND!r}")
            worker.wait()
    except JobwrapError as exc:
        # out of time, or the worker died: say so for every directive not yet done
        items.extend(_failed(s, str(exc)) for s in specs[len(items):])
    finally:
        os.close(scratch_fd)
    return StageReport(tuple(items))


def resolve_or_keep(dest: str, work_dir: str | None) -> str:
    return os.path.join(work_dir, dest) if work_dir and not os.path.isabs(dest) else dest


def _missing(spec: StageOut, dest: str) -> StageItem:
    return StageItem(direction="out", directive=spec.directive, source=spec.source,
                     dest=dest, missing=True)


def _failed(spec: StageOut, problem: str) -> StageItem:
    return StageItem(direction="out", directive=spec.directive, source=spec.source,
                     dest=spec.dest, problems=(problem,))


def _worker(channel: Channel, *, specs: list[StageOut], scratch_fd: int,
            settings: StageSettings, work_dir: str | None) -> None:
    raise_fd_limit()
    os.umask(0o022)  # folders made on shared storage get the usual modes
    report = reporter(channel)
    for spec in specs:
        started = time.monotonic()
        try:
            item = _stage_one(spec, scratch_fd, settings, work_dir, report, started)
        except (JobwrapError, OSError) as exc:
            text = prefixed(spec.directive, exc) if isinstance(exc, JobwrapError) else \
                f"{spec.directive}: {exc.strerror or exc}"
            item = StageItem(direction="out", directive=spec.directive, source=spec.source,
                             dest=resolve_or_keep(spec.dest, work_dir), problems=(text,),
                             seconds=round(time.monotonic() - started, 6))
        msg.send(channel, msg.ItemDone(item))
    msg.send(channel, msg.End())


def _stage_one(spec: StageOut, scratch_fd: int, settings: StageSettings,
               work_dir: str | None, report: ProgressFn, started: float) -> StageItem:
    dest = resolve(spec.dest, work_dir)
    try:
        os.stat(spec.source, dir_fd=scratch_fd)
    except FileNotFoundError:
        return _missing(spec, dest)
    parent, leaf = os.path.split(dest.rstrip("/"))
    if not leaf:
        raise UserInputError("DEST must name a file or folder, not '/'")
    with SourceTree(spec.source, dir_fd=scratch_fd, label="SRC") as src:
        manifest = src.manifest
        try:
            os.makedirs(parent, exist_ok=True)
            parent_fd = open_dir(parent, follow=True)  # the user's DEST, as the user
        except OSError as exc:
            raise UserInputError(f"cannot write into {parent!r} as the job's user "
                                 f"({exc.strerror}); choose a DEST the user may write") \
                from None
        try:
            check_space(parent_fd, need=space_needed(manifest, parent_fd),
                        files=len(manifest.entries), margin=0,
                        where=parent)
            meter = Meter(spec.directive, len(manifest.files), manifest.total_bytes, report,
                          interval=settings.progress_interval)
            tree = DirTree(parent_fd)
            try:
                result = copy_tree(manifest, src.open, tree, leaf, verify=settings.verify,
                                   parallel=settings.parallel, meter=meter, replace=True,
                                   keep_going=True)
            finally:
                tree.close()
            meter.finish()
        finally:
            os.close(parent_fd)
    return StageItem(direction="out", directive=spec.directive,
                     source=spec.source, dest=dest, files=result.files, bytes=result.bytes,
                     seconds=round(time.monotonic() - started, 6),
                     problems=tuple(f"{spec.directive}: {p}" for p in result.problems[:50]),
                     checksums=result.checksums)
