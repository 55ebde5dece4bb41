"""Stage-in, root's side: the hook answers the user-side worker and keeps the node cache.

Root reads every message of the worker through ``wrapper.staging.messages.decode`` (the
conversation is there; the worker's side is ``wrapper.staging.worker``) and places
cached data into the job's scratch itself.

The hook keys the cache by the path of the source's own descriptor (``/proc/self/fd``),
never by a name resolved again: a symlink swapped meanwhile cannot label one tree's
content with another dataset's path. A cache that runs out of space or quota is the
node's problem: that dataset is staged without it (logged loudly), the job goes on.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator

from wrapper.errors import UserInputError
from wrapper.staging import messages as msg
from wrapper.staging.cache import Cache, CacheFull, Claim, Placement
from wrapper.staging.channel import close_fds
from wrapper.staging.copy import Meter, TreeResult, check_space, space_needed
from wrapper.staging.errors import StagingError, about, prefixed
from wrapper.staging.privileges import UserIds, Worker
from wrapper.staging.report import ProgressFn, StageItem
from wrapper.staging.settings import StageSettings
from wrapper.staging.spec import StageIn
from wrapper.staging.tree import DIR, FILE, Entry, Manifest, opened_path


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


class Server:
    """Root's half of one stage-in: reads the worker's messages until it ends, answers its
    cache questions (with ``cache``), and gathers the items."""

    def __init__(self, worker: Worker, specs: list[StageIn], *, cache: Cache | None,
                 scratch_fd: int, user: UserIds, settings: StageSettings,
                 report: ProgressFn | None, deadline: float | None) -> None:
        self.worker = worker
        self.specs = specs
        self.cache = cache
        self.scratch_fd = scratch_fd
        self.user = user
        self.settings = settings
        self.report = report
        self.deadline = deadline

    def run(self) -> list[StageItem]:
        """Every item, in the order the worker finished them, once it said ``End``."""
        items: list[StageItem] = []
        while True:
            message, fds = msg.receive(self.worker)
            if not isinstance(message, msg.CacheAsk) or self.cache is None:
                close_fds(fds)  # only a cache question carries one (the source's)
            if isinstance(message, msg.ProgressNote):
                if self.report is not None:
                    self.report(message.progress)
            elif isinstance(message, msg.ItemDone):
                items.append(message.item)
            elif isinstance(message, msg.CacheAsk) and self.cache is not None:
                try:
                    item = self.answer(self.cache, message, fds)
                finally:
                    close_fds(fds)
                if item is not None:
                    items.append(item)
            elif isinstance(message, msg.End):
                return items
            else:
                raise StagingError(f"the staging worker sent an unexpected {message.KIND!r}")

    def answer(self, cache: Cache, ask: msg.CacheAsk, fds: list[int]) -> StageItem | None:
        """Serve one directive from the cache; its item when root placed it, None when the
        worker stages it (told ``Direct``, or to unpack the cached archive)."""
        if ask.index >= len(self.specs):
            raise StagingError("the staging worker asked about an unknown directive")
        spec = self.specs[ask.index]
        try:
            manifest = source_of(ask.manifest, fds)
        except UserInputError as exc:
            raise UserInputError(prefixed(spec.directive, exc)) from None
        started = time.monotonic() - ask.scan_seconds
        with about(spec.directive):
            placed = self._through_cache(cache, spec, manifest)
        if placed is None:
            return None
        result, claim = placed
        msg.send(self.worker, msg.Placed())
        return StageItem(direction="in", directive=spec.directive, source=manifest.source,
                         dest=spec.dest, files=result.files, bytes=result.bytes,
                         seconds=round(time.monotonic() - started, 6), cache_hit=claim.hit,
                         cache_wait=round(claim.waited, 6), checksums=result.checksums,
                         cache_key=claim.key)

    def _through_cache(self, cache: Cache, spec: StageIn,
                       manifest: Manifest) -> tuple[TreeResult, Claim] | None:
        """Fill the entry on a miss, then place it (or hand the archive to unpack); None
        when the worker has been told to stage it."""
        if not spec.unpack and cache.needs_copy(self.scratch_fd):
            check_space(self.scratch_fd, need=space_needed(manifest, self.scratch_fd),
                        files=len(manifest.entries), margin=self.settings.free_margin_bytes)
        with cache.claim(cache.key_for(manifest), deadline=self.deadline) as claim:
            filled: tuple[Meter, Placement | None] | None = None
            if not claim.hit:
                filled = self._fill(cache, claim, spec, manifest)
                if filled is None:
                    return None
            if spec.unpack:
                self._hand_archive(cache, claim)
                return None
            if filled is not None and filled[1] is not None:
                meter, result = filled[0], filled[1].result  # placed while filling
            else:
                meter = self._meter(spec, manifest)
                result = cache.place(claim, manifest, self.scratch_fd, spec.dest, self.user,
                                     verify=self.settings.verify,
                                     parallel=self.settings.parallel, meter=meter)
            meter.finish()
        return result, claim

    def _fill(self, cache: Cache, claim: Claim, spec: StageIn,
              manifest: Manifest) -> tuple[Meter, Placement | None] | None:
        """Fill the claimed entry from the worker's descriptors: its meter and, where
        scratch takes hard links, what the fill placed there as it went; None when the
        cache cannot take the dataset (the worker has been told ``Direct``)."""
        if not cache.reserve(claim, cache.disk_bytes(manifest), len(manifest.entries)):
            msg.send(self.worker, msg.Direct())
            return None
        msg.send(self.worker, msg.Send())
        meter = self._meter(spec, manifest)
        batches = _Batches(self.worker, manifest)
        # One pass: each file is linked into scratch as soon as it is cached.
        place = None if spec.unpack or cache.needs_copy(self.scratch_fd) else Placement(
            self.scratch_fd, spec.dest, self.user)
        try:
            cache.fill(claim, manifest, batches, verify=self.settings.verify,
                       parallel=self.settings.parallel, meter=meter, place=place)
        except CacheFull as exc:
            # The node's disk, not the job's data: stage it without the cache.
            from wrapper import log

            log.get().error("staging.cache_full", directive=spec.directive, error=str(exc),
                            action="staged without the cache")
            batches.abandon()
            return None
        return meter, place

    def _hand_archive(self, cache: Cache, claim: Claim) -> None:
        """Give the worker the cached archive to unpack."""
        fd = cache.open_data(claim)
        try:
            msg.send(self.worker, msg.Unpack(hit=claim.hit, wait=claim.waited), [fd])
        finally:
            os.close(fd)

    def _meter(self, spec: StageIn, manifest: Manifest) -> Meter:
        return Meter(spec.directive, len(manifest.files), manifest.total_bytes, self.report,
                     interval=self.settings.progress_interval)


class _Batches:
    """The worker's descriptor batches of a cache fill, as the fill consumes them.

    Each batch is answered (``More``) as soon as it is received, so the worker opens the
    next one while the fill copies this one; the fill bounds how many wait."""

    def __init__(self, worker: Worker, manifest: Manifest) -> None:
        self.worker = worker
        self.by_path = {e.path: e for e in manifest.files}
        self.owed = True  # the worker's next message is on its way to us

    def __iter__(self) -> Iterator[list[tuple[Entry, int]]]:
        while True:
            message, fds = msg.receive(self.worker)
            self.owed = False
            if isinstance(message, msg.FdsEnd) and not fds:
                return
            if not isinstance(message, msg.Fds) or len(message.paths) != len(fds) \
                    or not all(p in self.by_path for p in message.paths):
                close_fds(fds)
                raise StagingError("the staging worker sent descriptors that do not match "
                                   "its manifest")
            msg.send(self.worker, msg.More())
            self.owed = True
            yield [(self.by_path[p], fd) for p, fd in zip(message.paths, fds, strict=True)]

    def abandon(self) -> None:
        """Tell the worker to copy the data itself. It waits for an answer to what it sent
        last (a batch, or the end); a message still on its way is read (and its
        descriptors closed) first."""
        if self.owed:
            _, fds = self.worker.recv()
            close_fds(fds)
        msg.send(self.worker, msg.Direct())
