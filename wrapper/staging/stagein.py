"""Stage-in: a worker with the user's rights reads the sources; the hook (root) keeps the
node cache and places cached data into the job's scratch.

The conversation, per directive, when a cache is used::

    worker -> hook   cache {index, manifest} + the source's descriptor
                                                  (every file opened once: readable)
    hook -> worker   send | direct                (miss | cannot cache: copy yourself)
    worker -> hook   fds {paths} + descriptors    (batches of one folder; the hook answers
                                                  more on receipt and copies meanwhile,
                                                  linking each file into scratch when
                                                  scratch takes hard links, or answers
                                                  direct when the cache is full)
    worker -> hook   fds-end
    hook -> worker   placed | unpack + descriptor (hook linked it | unpack the archive)
                     | direct                     (the cache is full: copy yourself)

The hook keys the cache by the path of the source's own descriptor (``/proc/self/fd``),
never by a name resolved again: a symlink swapped meanwhile cannot label one tree's
content with another dataset's path. A cache that runs out of space or quota is the
node's problem: that dataset is staged without it (logged loudly), the job goes on.

Without a cache the worker copies (or unpacks) straight into scratch and reports the
item. Any error ends the whole stage-in: the job must not start without its data.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path

from wrapper.errors import JobwrapError, UserInputError
from wrapper.osl.dirs import DirTree, first_missing, open_dir, raise_fd_limit
from wrapper.staging.cache import Cache, CacheFull, Placement
from wrapper.staging.channel import MAX_FDS, Channel
from wrapper.staging.copy import Meter, check_space, copy_tree, space_needed
from wrapper.staging.errors import StagingError
from wrapper.staging.privileges import UserIds, Worker
from wrapper.staging.report import Progress, StageItem, StageReport
from wrapper.staging.scratch import remove_tree
from wrapper.staging.settings import StageSettings
from wrapper.staging.spec import StageIn
from wrapper.staging.tree import DIR, FILE, Entry, Manifest, SourceTree, opened_path
from wrapper.staging.unpack import unpack

_BATCH = MAX_FDS  # descriptors per message (the kernel allows 253)
ProgressFn = Callable[[Progress], None]


def stage_in(specs: Sequence[StageIn], *, scratch: Path, user: UserIds,
             cache: Cache | None = None, settings: StageSettings | None = None,
             progress: ProgressFn | None = None, work_dir: str | None = None,
             timeout: float | None = None) -> StageReport:
    """Stage every directive into ``scratch`` (made by prepare_scratch) for ``user``.

    Raises UserInputError (the job's fault: the message names the directive) or
    StagingError; on success every file is in place and verified.
    """
    specs = list(specs)
    if not specs:
        return StageReport()
    settings = settings or StageSettings()
    report = serialized(progress)
    deadline = time.monotonic() + timeout if timeout is not None else None
    raise_fd_limit()  # placing from the cache holds one descriptor per folder
    scratch_fd = open_scratch(scratch, user)
    items: list[StageItem] = []
    try:
        body = partial(_worker, specs=specs, scratch_fd=scratch_fd,
                       key_mode=cache.key_mode if cache else None, settings=settings,
                       work_dir=work_dir)
        with Worker(user, body, keep_fds=[scratch_fd], timeout=timeout) as worker:
            while True:
                message, fds = worker.recv()
                kind = message["t"]
                if kind != "cache" or cache is None:
                    _close(fds)  # only a cache question carries one (the source's)
                if kind == "progress":
                    if report is not None:
                        report(Progress.from_wire(message.get("p")))
                elif kind == "item":
                    items.append(StageItem.from_wire(message.get("item")))
                elif kind == "cache" and cache is not None:
                    try:
                        item = _serve(worker, message, fds, specs, cache, scratch_fd, user,
                                      settings, report, deadline)
                    finally:
                        _close(fds)
                    if item is not None:
                        items.append(item)
                elif kind == "end":
                    break
                else:
                    raise StagingError(f"the staging worker sent an unexpected {kind!r}")
            status = worker.wait()
            if status != 0:
                raise StagingError(f"the staging worker ended with status {status}")
    finally:
        os.close(scratch_fd)
    return StageReport(tuple(items))


def open_scratch(scratch: Path, user: UserIds) -> int:
    """Open the job's scratch (no-follow) and check it is the user's folder."""
    try:
        fd = open_dir(scratch)
    except OSError as exc:
        raise StagingError(f"cannot open the scratch folder {scratch}: {exc.strerror} (did "
                           "prepare_scratch run on this node?)") from None
    info = os.fstat(fd)
    if info.st_uid != user.uid:
        os.close(fd)
        raise StagingError(f"{scratch} belongs to uid {info.st_uid}, not to the job's user "
                           f"{user.describe()}")
    return fd


def prefixed(directive: str, exc: JobwrapError) -> str:
    """The error's message, starting with the directive it is about."""
    text = str(exc)
    return text if text.startswith(directive) else f"{directive}: {text}"


# -- the hook's side (root) -----------------------------------------------------------------


def source_of(manifest: Manifest, fds: list[int]) -> Manifest:
    """The manifest, its source named by root from the worker's open descriptor of it.

    The cache key names the source, so root takes that name from the descriptor the
    scan read (the kernel's path of it), never from a path resolved by name or from the
    worker's word; a descriptor that is not what the manifest describes is refused.
    """
    if len(fds) != 1:
        raise StagingError("the staging worker sent no descriptor of its source")
    info = os.fstat(fds[0])
    kind = DIR if stat.S_ISDIR(info.st_mode) else FILE if stat.S_ISREG(info.st_mode) else ""
    if kind != manifest.kind:
        raise UserInputError("SRC changed while it was being staged; stage data that is not "
                             "being written")
    real = opened_path(fds[0])
    if real != manifest.source:
        raise UserInputError(f"SRC was moved while it was being staged (now {real!r}); "
                             "stage data that is not being changed")
    return manifest


def _serve(worker: Worker, message: dict[str, object], fds: list[int], specs: list[StageIn],
           cache: Cache, scratch_fd: int, user: UserIds, settings: StageSettings,
           report: ProgressFn | None, deadline: float | None) -> StageItem | None:
    index = message.get("index")
    if not isinstance(index, int) or not 0 <= index < len(specs):
        raise StagingError("the staging worker asked about an unknown directive")
    spec = specs[index]
    try:
        manifest = source_of(Manifest.from_wire(message.get("manifest")), fds)
    except UserInputError as exc:
        raise UserInputError(prefixed(spec.directive, exc)) from None
    scanned = message.get("scan_seconds")
    started = time.monotonic() - (scanned if isinstance(scanned, float | int) else 0.0)
    interval = settings.progress_interval
    try:
        if not spec.unpack and cache.needs_copy(scratch_fd):
            check_space(scratch_fd, need=space_needed(manifest, scratch_fd),
                        files=len(manifest.entries), margin=settings.free_margin_bytes)
        place: Placement | None = None
        with cache.claim(cache.key_for(manifest), deadline=deadline) as claim:
            if not claim.hit:
                if not cache.reserve(claim, cache.disk_bytes(manifest),
                                     len(manifest.entries)):
                    worker.send({"t": "direct"})
                    return None
                worker.send({"t": "send"})
                meter = Meter(spec.directive, len(manifest.files), manifest.total_bytes,
                              report, interval=interval)
                batches = _Batches(worker, manifest)
                # One pass: each file is linked into scratch as soon as it is cached.
                place = None if spec.unpack or cache.needs_copy(scratch_fd) else Placement(
                    scratch_fd, spec.dest, user)
                try:
                    cache.fill(claim, manifest, batches, verify=settings.verify,
                               parallel=settings.parallel, meter=meter, place=place)
                except CacheFull as exc:
                    # The node's disk, not the job's data: stage it without the cache.
                    from wrapper import log

                    log.get().error("staging.cache_full", directive=spec.directive,
                                    error=str(exc), action="staged without the cache")
                    batches.abandon()
                    return None
            if spec.unpack:
                fd = cache.open_data(claim)
                try:
                    worker.send({"t": "unpack", "hit": claim.hit, "wait": claim.waited}, [fd])
                finally:
                    os.close(fd)
                return None
            if place is not None:
                result = place.result
            else:
                meter = Meter(spec.directive, len(manifest.files), manifest.total_bytes,
                              report, interval=interval)
                result = cache.place(claim, manifest, scratch_fd, spec.dest, user,
                                     verify=settings.verify, parallel=settings.parallel,
                                     meter=meter)
            meter.finish()
    except UserInputError as exc:
        raise UserInputError(prefixed(spec.directive, exc)) from None
    except StagingError as exc:
        raise StagingError(prefixed(spec.directive, exc)) from None
    worker.send({"t": "placed"})
    return StageItem(direction="in", directive=spec.directive, source=manifest.source,
                     dest=spec.dest, files=result.files, bytes=result.bytes,
                     seconds=round(time.monotonic() - started, 6), cache_hit=claim.hit,
                     cache_wait=round(claim.waited, 6), checksums=result.checksums,
                     cache_key=claim.key)


class _Batches:
    """The worker's descriptor batches of a cache fill, as the fill consumes them.

    Each batch is answered (``more``) as soon as it is received, so the worker opens the
    next one while the fill copies this one; the fill bounds how many wait."""

    def __init__(self, worker: Worker, manifest: Manifest) -> None:
        self.worker = worker
        self.by_path = {e.path: e for e in manifest.files}
        self.started = False
        self.owed = True  # the worker's next message is on its way to us

    def __iter__(self) -> Iterator[list[tuple[Entry, int]]]:
        self.started = True
        while True:
            message, fds = self.worker.recv()
            self.owed = False
            paths = message.get("paths")
            if message["t"] == "fds-end" and not fds:
                return
            if message["t"] != "fds" or not isinstance(paths, list) \
                    or len(paths) != len(fds) \
                    or not all(isinstance(p, str) and p in self.by_path for p in paths):
                _close(fds)
                raise StagingError("the staging worker sent descriptors that do not match "
                                   "its manifest")
            self.worker.send({"t": "more"})
            self.owed = True
            yield [(self.by_path[p], fd) for p, fd in zip(paths, fds, strict=True)]

    def abandon(self) -> None:
        """Tell the worker to copy the data itself. It waits for an answer to what it sent
        last (a batch, or the end); a message still on its way is read (and its
        descriptors closed) first."""
        if self.owed:
            _, fds = self.worker.recv()
            _close(fds)
        self.worker.send({"t": "direct"})


def serialized(progress: ProgressFn | None) -> ProgressFn | None:
    """The caller's callback, called by one thread at a time (copy threads report too)."""
    if progress is None:
        return None
    lock = threading.Lock()

    def report(update: Progress) -> None:
        with lock:
            progress(update)

    return report


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


# -- the worker's side (the user's rights) --------------------------------------------------


def _worker(channel: Channel, *, specs: list[StageIn], scratch_fd: int, key_mode: str | None,
            settings: StageSettings, work_dir: str | None) -> None:
    raise_fd_limit()

    def report(update: Progress) -> None:
        channel.send({"t": "progress", "p": update.as_dict()})

    for index, spec in enumerate(specs):
        try:
            item = _stage_one(channel, index, spec, scratch_fd, key_mode, settings, work_dir,
                              report)
        except UserInputError as exc:
            raise UserInputError(prefixed(spec.directive, exc)) from None
        except StagingError as exc:
            raise StagingError(prefixed(spec.directive, exc)) from None
        if item is not None:
            channel.send({"t": "item", "item": item.as_dict()})
    channel.send({"t": "end"})


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
        hit: bool | None = None
        wait = 0.0
        if key_mode is not None:
            channel.send({"t": "cache", "index": index, "manifest": manifest.to_wire(),
                          "scan_seconds": time.monotonic() - started}, [src.root_fd])
            reply, fds = channel.recv()
            if reply["t"] == "send":
                _close(fds)
                if _send_fds(channel, src):
                    reply, fds = channel.recv()
                else:
                    reply, fds = {"t": "direct"}, []
            if reply["t"] == "placed":
                _close(fds)
                return None
            if reply["t"] == "unpack" and len(fds) == 1:
                waited = reply.get("wait")
                try:
                    return _unpack(spec, manifest, fds[0], scratch_fd, settings, report,
                                   started, hit=bool(reply.get("hit")),
                                   wait=float(waited) if isinstance(waited, float | int)
                                   else 0.0)
                finally:
                    _close(fds)
            _close(fds)
            if reply["t"] != "direct":
                raise StagingError(f"unexpected reply {reply['t']!r} from the hook")
        if spec.unpack:
            fd = src.open(manifest.entries[0])
            try:
                return _unpack(spec, manifest, fd, scratch_fd, settings, report, started,
                               hit=hit, wait=wait)
            finally:
                os.close(fd)
        return _copy(spec, src, scratch_fd, settings, report, started)


def resolve(source: str, work_dir: str | None) -> str:
    """A path on shared storage, made absolute against the job's working directory."""
    if os.path.isabs(source):
        return source
    if not work_dir:
        raise UserInputError(f"{source!r} is relative and the job's working directory is not "
                             "known here; write the full path")
    return os.path.join(work_dir, source)


def _send_fds(channel: Channel, src: SourceTree) -> bool:
    """Send every file's descriptor to the hook filling the cache; False when the hook
    answered ``direct`` halfway (the cache is full: the worker copies it itself).

    A batch holds files of one folder only (the hook copies a folder's files in order on
    one thread); the hook answers each batch on receipt, so this opens the next while it
    copies."""
    for batch in _folder_batches(src.manifest.files):
        fds: list[int] = []
        try:
            for entry in batch:
                fds.append(src.open(entry))
            channel.send({"t": "fds", "paths": [e.path for e in batch]}, fds)
        finally:
            _close(fds)  # the hook holds its own copies now
        reply, extra = channel.recv()
        _close(extra)
        if reply["t"] == "direct":
            return False
        if reply["t"] != "more":
            raise StagingError(f"unexpected reply {reply['t']!r} from the hook")
    channel.send({"t": "fds-end"})
    return True


def _folder_batches(files: Sequence[Entry]) -> Iterator[Sequence[Entry]]:
    """Runs of files in one folder (the manifest lists a folder's files together), at
    most ``_BATCH`` each."""
    start = 0
    folder = None
    for i, entry in enumerate(files):
        parent = entry.path.rpartition("/")[0]
        if i > start and (parent != folder or i - start >= _BATCH):
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
