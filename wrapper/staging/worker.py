"""Stage-in, the worker's side: a child holding only the job user's rights reads the sources.

Per directive it scans the source (``SourceTree``: every file opened once when a cache
is used, to prove the user may read it), then either asks root whether the node cache
serves it (``wrapper.staging.messages`` has the conversation; root's side is
``wrapper.staging.server``), or copies (or unpacks) it straight into scratch and reports
the item. What root answers is decoded and checked like what root reads.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence

from wrapper.errors import JobwrapError, UserInputError
from wrapper.osl.dirs import DirTree, first_missing, raise_fd_limit
from wrapper.staging import messages as msg
from wrapper.staging.channel import MAX_FDS, Channel, close_fds
from wrapper.staging.copy import Meter, check_space, copy_tree, space_needed
from wrapper.staging.errors import StagingError, about
from wrapper.staging.report import Progress, ProgressFn, StageItem
from wrapper.staging.scratch import remove_tree
from wrapper.staging.settings import StageSettings
from wrapper.staging.spec import StageIn
from wrapper.staging.tree import FILE, Entry, Manifest, SourceTree
from wrapper.staging.unpack import unpack

BATCH = MAX_FDS  # descriptors per message (the kernel allows 253)


def work(channel: Channel, *, specs: list[StageIn], scratch_fd: int, key_mode: str | None,
         settings: StageSettings, work_dir: str | None) -> None:
    """The worker's whole stage-in (it runs as the user): each directive in turn."""
    raise_fd_limit()
    report = reporter(channel)
    for index, spec in enumerate(specs):
        with about(spec.directive):
            item = _stage_one(channel, index, spec, scratch_fd, key_mode, settings, work_dir,
                              report)
        if item is not None:
            msg.send(channel, msg.ItemDone(item))
    msg.send(channel, msg.End())


def reporter(channel: Channel) -> ProgressFn:
    """A progress callback that tells root."""

    def report(update: Progress) -> None:
        msg.send(channel, msg.ProgressNote(update))

    return report


def resolve(source: str, work_dir: str | None) -> str:
    """A path on shared storage, made absolute against the job's working directory."""
    if os.path.isabs(source):
        return source
    if not work_dir:
        raise UserInputError(f"{source!r} is relative and the job's working directory is not "
                             "known here; write the full path")
    return os.path.join(work_dir, source)


def _stage_one(channel: Channel, index: int, spec: StageIn, scratch_fd: int,
               key_mode: str | None, settings: StageSettings, work_dir: str | None,
               report: ProgressFn) -> StageItem | None:
    started = time.monotonic()
    source = resolve(spec.source, work_dir)
    with SourceTree(source, checksums=key_mode == "sha256",
                    prove_read=key_mode is not None) as src:
        manifest = src.manifest
        if spec.unpack and manifest.kind != FILE:
            raise UserInputError("SRC is a folder; only an archive file can be unpacked "
                                 "(drop ':unpack' to copy the folder as it is)")
        if manifest.kind == FILE and not spec.unpack and spec.dest == ".":
            raise UserInputError("DEST '.' is the scratch folder itself; a file needs a name "
                                 "(--stage-in=SRC:NAME)")
        if key_mode is not None:
            reply, fds = _ask_cache(channel, index, src, started)
            try:
                if isinstance(reply, msg.Placed):
                    return None
                if isinstance(reply, msg.Unpack) and len(fds) == 1:
                    return _unpack(spec, manifest, fds[0], scratch_fd, settings, report,
                                   started, hit=reply.hit, wait=reply.wait)
                if not isinstance(reply, msg.Direct):
                    raise StagingError(f"unexpected reply {reply.KIND!r} from the hook")
            finally:
                close_fds(fds)
        if spec.unpack:
            fd = src.open(manifest.entries[0])
            try:
                return _unpack(spec, manifest, fd, scratch_fd, settings, report, started,
                               hit=None, wait=0.0)
            finally:
                os.close(fd)
        return _copy(spec, src, scratch_fd, settings, report, started)


def _ask_cache(channel: Channel, index: int, src: SourceTree,
               started: float) -> tuple[msg.Message, list[int]]:
    """Root's last word on directive ``index`` (``Placed``, ``Unpack`` and its descriptor,
    or ``Direct``), the files' descriptors sent first when root asks for them."""
    msg.send(channel, msg.CacheAsk(index, src.manifest, time.monotonic() - started), [src.root_fd])
    reply, fds = msg.receive(channel, sender=msg.HOOK)
    if isinstance(reply, msg.Send):
        close_fds(fds)
        if _send_fds(channel, src):
            return msg.receive(channel, sender=msg.HOOK)
        return msg.Direct(), []
    return reply, fds


def _send_fds(channel: Channel, src: SourceTree) -> bool:
    """Send every file's descriptor to the hook filling the cache; False when the hook
    answered ``Direct`` halfway (the cache is full: the worker copies it itself).

    A batch holds files of one folder only (the hook copies a folder's files in order on
    one thread); the hook answers each batch on receipt, so this opens the next while it
    copies."""
    for batch in folder_batches(src.manifest.files):
        fds: list[int] = []
        try:
            for entry in batch:
                fds.append(src.open(entry))
            msg.send(channel, msg.Fds(tuple(e.path for e in batch)), fds)
        finally:
            close_fds(fds)  # the hook holds its own copies now
        reply, extra = msg.receive(channel, sender=msg.HOOK)
        close_fds(extra)
        if isinstance(reply, msg.Direct):
            return False
        if not isinstance(reply, msg.More):
            raise StagingError(f"unexpected reply {reply.KIND!r} from the hook")
    msg.send(channel, msg.FdsEnd())
    return True


def folder_batches(files: Sequence[Entry]) -> Iterator[Sequence[Entry]]:
    """Runs of files in one folder (the manifest lists a folder's files together), at
    most ``BATCH`` each."""
    start = 0
    folder = None
    for i, entry in enumerate(files):
        parent = entry.path.rpartition("/")[0]
        if i > start and (parent != folder or i - start >= BATCH):
            yield files[start:i]
            start = i
        folder = parent
    if start < len(files):
        yield files[start:]


def _copy(spec: StageIn, src: SourceTree, scratch_fd: int, settings: StageSettings,
          report: ProgressFn, started: float) -> StageItem:
    manifest = src.manifest
    dest = "" if spec.dest == "." else spec.dest
    check_space(scratch_fd, need=space_needed(manifest, scratch_fd),
                files=len(manifest.entries), margin=settings.free_margin_bytes)
    meter = Meter(spec.directive, len(manifest.files), manifest.total_bytes, report,
                  interval=settings.progress_interval)
    with _UndoOnFailure(scratch_fd, dest) as tree:
        result = copy_tree(manifest, src.open, tree, dest, verify=settings.verify,
                           parallel=settings.parallel, meter=meter)
    meter.finish()
    return StageItem(direction="in", directive=spec.directive, source=manifest.source,
                     dest=spec.dest, files=result.files, bytes=result.bytes,
                     seconds=round(time.monotonic() - started, 6), checksums=result.checksums)


def _unpack(spec: StageIn, manifest: Manifest, fd: int, scratch_fd: int,
            settings: StageSettings, report: ProgressFn, started: float, *,
            hit: bool | None, wait: float) -> StageItem:
    dest = "" if spec.dest == "." else spec.dest
    # the archive's own size is the least its contents need
    check_space(scratch_fd, need=manifest.total_bytes, files=1,
                margin=settings.free_margin_bytes)
    meter = Meter(spec.directive, 0, 0, report, interval=settings.progress_interval)
    with _UndoOnFailure(scratch_fd, dest) as tree:
        result = unpack(fd, tree, dest, label=spec.directive, verify=settings.verify,
                        margin=settings.free_margin_bytes, meter=meter,
                        zstd_command=settings.zstd_command)
    meter.finish()
    return StageItem(direction="in", directive=spec.directive, source=manifest.source,
                     dest=spec.dest, files=result.files, bytes=result.bytes,
                     seconds=round(time.monotonic() - started, 6), cache_hit=hit,
                     cache_wait=round(wait, 6), unpacked=True, checksums=result.checksums)


class _UndoOnFailure:
    """A DirTree on scratch; if the stage fails, what it created under DEST goes away."""

    def __init__(self, scratch_fd: int, dest: str) -> None:
        self.scratch_fd = scratch_fd
        self.created = first_missing(scratch_fd, dest)
        self.tree = DirTree(scratch_fd)

    def __enter__(self) -> DirTree:
        return self.tree

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        self.tree.close()
        if kind is None or not self.created:
            return
        parent, _, leaf = self.created.rpartition("/")
        lookup = DirTree(self.scratch_fd, create=False)
        try:
            remove_tree(lookup.get(parent), leaf)
        except (OSError, JobwrapError):
            pass  # the epilog removes scratch anyway; the first error is the one to report
        finally:
            lookup.close()
