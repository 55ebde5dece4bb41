"""Stage-in: a worker with the user's rights reads the sources; the hook (root) keeps the
node cache and places cached data into the job's scratch.

``stage_in`` forks the worker (``wrapper.staging.worker``: the user's side) and serves
it (``wrapper.staging.server``: root's side); the two talk in the typed messages of
``wrapper.staging.messages``, which root decodes and bounds before it looks at them.
With a cache the worker asks root per directive whether the cache serves it, and root
fills the entry from the descriptors the worker opened, then links (or copies) it into
scratch; without one the worker copies (or unpacks) straight into scratch and reports
the item. Any error ends the whole stage-in: the job must not start without its data.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from wrapper.osl.dirs import open_dir, raise_fd_limit
from wrapper.staging.cache import Cache
from wrapper.staging.errors import StagingError
from wrapper.staging.privileges import UserIds, Worker
from wrapper.staging.report import Progress, ProgressFn, StageReport
from wrapper.staging.server import Server
from wrapper.staging.server import source_of as source_of  # where callers found it
from wrapper.staging.settings import StageSettings
from wrapper.staging.spec import StageIn
from wrapper.staging.worker import work


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
    try:
        body = partial(work, specs=specs, scratch_fd=scratch_fd,
                       key_mode=cache.key_mode if cache else None, settings=settings,
                       work_dir=work_dir)
        with Worker(user, body, keep_fds=[scratch_fd], timeout=timeout) as worker:
            items = Server(worker, specs, cache=cache, scratch_fd=scratch_fd, user=user,
                           settings=settings, report=report, deadline=deadline).run()
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


def serialized(progress: ProgressFn | None) -> ProgressFn | None:
    """The caller's callback, called by one thread at a time (copy threads report too)."""
    if progress is None:
        return None
    lock = threading.Lock()

    def report(update: Progress) -> None:
        with lock:
            progress(update)

    return report
