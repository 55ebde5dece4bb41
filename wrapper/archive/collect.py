"""Gather one attempt's files on one node into a folder of the archive, compressed as they stream.

What is gathered: the job's stdout and stderr (and any further output files asked for),
the batch script (text the caller got from Slurm), the supervisor's log and the job's
events (this attempt's lines), and this node's jobwrap hook log lines for the job.

The job's own files are read with the job user's rights, never root's: a symlink to a
root-only file is refused by the kernel, and so is anything else the user could not read
(a FIFO or a device is refused too, since opening one could block or never end). The
bytes are streamed, never held in memory: the user-rights child (``call_as``) opens the
file and ``sendfile``s it into a pipe that root created before the fork, and a root
thread compresses what comes out of the pipe straight into the archive file. Chosen over
a staging folder owned by the user because no user-writable path is ever involved, so
there is nothing for the user to swap between the copy and root's read of it. The child
arms a timer with what is left of the time budget: a file that cannot be read in time
(a hung file system, a huge log) ends the child and is recorded as partial.

The state files (events, supervisor log) and the hook log live in root-owned folders,
where the user can neither add nor swap a name: they are read as root, through
``O_NOFOLLOW``. (The supervisor log's content is the user's, since the supervisor runs as
them; it is copied as data, its last ``max_file_bytes`` at most.)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gzip
import hashlib
import json
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, field
from typing import Any

from wrapper.archive._fs import Access, create_file
from wrapper.errors import JobwrapError
from wrapper.fastdataclass import dataclass
from wrapper.job.paths import SUPERVISOR_LOG
from wrapper.job.state import JobState
from wrapper.osl import jsontext
from wrapper.osl.child import call_as
from wrapper.osl.users import UserIds

# statuses: what happened to one file
ARCHIVED = "archived"    # all of it (or its last max_file_bytes: see truncated)
PARTIAL = "partial"      # the time budget ran out (or a write failed) part way
MISSING = "missing"      # it does not exist: nothing to archive
REFUSED = "refused"      # the job's user cannot read it, or it is no regular file
SKIPPED = "skipped"      # not tried: the time budget was spent
INCOMPLETE = frozenset({PARTIAL, SKIPPED})  # the archive's fault, not the user's

_CHUNK = 1 << 20


@dataclass
class ArchivedFile:
    """One file of an attempt's folder in the archive, and how it got (or did not get) there."""

    name: str            # its name in the attempt's node folder, e.g. "stdout.gz"
    kind: str            # stdout | stderr | output | script | supervisor_log | events | hook_log
    source: str          # where it was read from ("" for the batch script)
    status: str = MISSING
    size: int = 0        # bytes archived, before compression
    source_size: int | None = None  # the original's size when it was read
    stored: int = 0      # bytes in the archive (compressed)
    sha256: str = ""     # of the archived bytes, before compression
    truncated: bool = False  # only the last max_file_bytes were kept
    same_as: str = ""    # stderr that is the stdout file: archived once, under this name
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Limits:
    max_file_bytes: int
    compress_level: int
    hook_log_scan_bytes: int
    deadline: float  # on ``clock``'s scale
    clock: Callable[[], float] = time.monotonic

    def left(self) -> float:
        return self.deadline - self.clock()


@dataclass(frozen=True)
class OutputSpec:
    """A file of the job's: where it may be (first existing wins) and its archive name."""

    kind: str
    name: str
    candidates: tuple[str, ...]


@dataclass(frozen=True)
class Sources:
    """Everything ``collect`` reads for one attempt on one node."""

    job_id: str
    attempt: int
    state: JobState
    events: list[dict[str, Any]] = field(default_factory=list)
    outputs: tuple[OutputSpec, ...] = ()
    script_text: str = ""
    hook_log: str = ""
    user: UserIds | None = None  # None: no job user known, so no user file is read


def collect(dest: int, access: Access, sources: Sources, limits: Limits) -> list[ArchivedFile]:
    """Write the attempt's files into the folder ``dest``; one record per file, in order."""
    files: list[ArchivedFile] = []
    seen: dict[tuple[str, ...], str] = {}
    for spec in sources.outputs:
        if spec.candidates in seen:
            files.append(ArchivedFile(spec.name, spec.kind, spec.candidates[0], ARCHIVED,
                                      same_as=seen[spec.candidates]))
            continue
        entry = copy_user_file(dest, access, spec, sources.user, limits)
        if entry.status in (ARCHIVED, PARTIAL):
            seen[spec.candidates] = entry.name
        files.append(entry)
    if sources.script_text:
        files.append(_write_text(dest, access, "batch-script.sh.gz", "script",
                                 sources.script_text.encode("utf-8", "surrogateescape"), limits))
    job_id, attempt = sources.job_id, sources.attempt
    files.append(copy_root_lines(dest, access, "supervisor.log.gz", "supervisor_log",
                                 str(sources.state.path / SUPERVISOR_LOG),
                                 _of_attempt(attempt), limits, scan=limits.max_file_bytes))
    events = b"".join(json.dumps(e, default=str).encode() + b"\n" for e in sources.events)
    files.append(_write_text(dest, access, "events.jsonl.gz", "events", events, limits))
    if sources.hook_log:
        files.append(copy_root_lines(dest, access, "hooks.log.gz", "hook_log", sources.hook_log,
                                     _of_job(job_id, attempt), limits,
                                     scan=limits.hook_log_scan_bytes))
    return files


# -- the job user's files ---------------------------------------------------------------
def copy_user_file(dest: int, access: Access, spec: OutputSpec, user: UserIds | None,
                   limits: Limits) -> ArchivedFile:
    """Stream one of the job's files, read with the user's rights, into ``dest``."""
    entry = ArchivedFile(spec.name, spec.kind, spec.candidates[0] if spec.candidates else "")
    if user is None:
        entry.status, entry.error = REFUSED, "no job user is known; the job's files are " \
                                             "never read with root's rights"
        return entry
    seconds = limits.left()
    if seconds <= 0:
        entry.status, entry.error = SKIPPED, "the archive's time budget was spent"
        return entry
    sink = _GzipSink(dest, spec.name, access, limits.compress_level)
    read_fd, write_fd = os.pipe()
    drained = _Drain(read_fd, sink)
    drained.start()
    try:
        outcome: dict[str, Any] = call_as(user, _send_file, list(spec.candidates), write_fd,
                                          limits.max_file_bytes, alarm=seconds,
                                          timeout=seconds + 5, keep_fds=[write_fd])
    except JobwrapError as exc:
        out_of_time = limits.left() <= 0.05
        outcome = {"status": PARTIAL,
                   "error": "the archive's time budget ran out while reading it" if out_of_time
                   else f"reading it as {user.name} failed: {exc}"}
    finally:
        os.close(write_fd)
        drained.join()
    entry.status = str(outcome.get("status", PARTIAL))
    entry.source = str(outcome.get("path") or entry.source)
    entry.error = str(outcome.get("error", ""))
    entry.source_size = outcome.get("source_size")
    entry.truncated = int(outcome.get("start", 0)) > 0
    if drained.error:
        entry.status, entry.error = PARTIAL, f"writing the archive failed: {drained.error}"
    _finish(dest, sink, entry)
    return entry


def _send_file(candidates: list[str], out_fd: int, max_bytes: int) -> dict[str, Any]:
    """(Runs as the job user.) Send the first existing candidate's tail into ``out_fd``;
    its child keeps no other end of the pipe, and ``call_as``'s alarm ends it in time."""
    for path in candidates:
        try:
            # O_NONBLOCK: opening a FIFO must not wait for a writer that never comes
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        except PermissionError:
            return {"status": REFUSED, "path": path,
                    "error": "permission denied when read with the job user's rights"}
        except OSError as exc:
            return {"status": REFUSED, "path": path, "error": exc.strerror or str(exc)}
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return {"status": REFUSED, "path": path, "error": "not a regular file"}
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
            size = info.st_size  # a file still growing is archived as it was now
            start = max(0, size - max_bytes)
            copied = _pump(fd, out_fd, start, size)
            return {"status": ARCHIVED, "path": path, "source_size": size, "start": start,
                    "copied": copied}
        finally:
            os.close(fd)
    return {"status": MISSING, "error": "no such file"}


def _pump(src: int, out: int, start: int, end: int) -> int:
    offset = start
    try:
        while offset < end:
            sent = os.sendfile(out, src, offset, min(_CHUNK * 4, end - offset))
            if sent == 0:
                break  # the file shrank under us
            offset += sent
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS):
            raise
        os.lseek(src, offset, os.SEEK_SET)  # a file system without sendfile support
        while offset < end and (chunk := os.read(src, min(_CHUNK, end - offset))):
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view):]
            offset += len(chunk)
    return offset - start


class _Drain(threading.Thread):
    """Root's side of the pipe: compress whatever arrives into the archive file."""

    def __init__(self, read_fd: int, sink: _GzipSink) -> None:
        super().__init__(daemon=True, name="archive-drain")
        self.read_fd = read_fd
        self.sink = sink
        self.error = ""

    def run(self) -> None:
        try:
            while chunk := os.read(self.read_fd, _CHUNK):
                if self.error:
                    continue  # keep reading, or the writer would block for ever
                try:
                    self.sink.write(chunk)
                except OSError as exc:
                    self.error = exc.strerror or str(exc)
        finally:
            os.close(self.read_fd)


# -- root's own files --------------------------------------------------------------------
def copy_root_lines(dest: int, access: Access, name: str, kind: str, path: str,
                    keep: Callable[[bytes], bool], limits: Limits, *, scan: int) -> ArchivedFile:
    """Copy the lines of a root-owned log that ``keep`` accepts, from its last ``scan`` bytes."""
    entry = ArchivedFile(name, kind, path)
    if limits.left() <= 0:
        entry.status, entry.error = SKIPPED, "the archive's time budget was spent"
        return entry
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return entry
    except OSError as exc:
        entry.status, entry.error = REFUSED, exc.strerror or str(exc)
        return entry
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            entry.status, entry.error = REFUSED, "not a regular file"
            return entry
        entry.source_size = info.st_size
        start = max(0, info.st_size - scan)
        handle.seek(start)
        if start:
            handle.readline()  # the first line is cut: skip it
        sink = _GzipSink(dest, name, access, limits.compress_level)
        entry.status = ARCHIVED
        lines = _bounded(handle, info.st_size - start)
        for count, line in enumerate(lines):
            if count % 4096 == 0 and limits.left() <= 0:
                entry.status, entry.error = PARTIAL, "the archive's time budget ran out"
                break
            if not keep(line):
                continue
            if sink.size + len(line) > limits.max_file_bytes:
                entry.truncated = True
                break
            sink.write(line)
        entry.truncated = entry.truncated or (start > 0 and kind != "hook_log")
    _finish(dest, sink, entry)
    return entry


def _bounded(handle: Any, limit: int) -> Iterable[bytes]:
    """The lines of a file up to ``limit`` bytes: what was there when it was opened."""
    read = 0
    for line in handle:
        read += len(line)
        if read > limit:
            return
        yield line


def _of_attempt(attempt: int) -> Callable[[bytes], bool]:
    def keep(line: bytes) -> bool:
        record = jsontext.loads(line)
        if record is None:
            return bool(line.strip())  # not JSON (a traceback): keep it
        return not isinstance(record, dict) or record.get("attempt", attempt) == attempt
    return keep


def _of_job(job_id: str, attempt: int) -> Callable[[bytes], bool]:
    digits = job_id.encode()

    def keep(line: bytes) -> bool:
        # The cheap test first (most lines are other jobs'): the id's digits are in every
        # line of the job whatever the log's JSON separators; the parse decides.
        if digits not in line:
            return False
        record = jsontext.loads_object(line)
        return record is not None and record.get("job_id") == job_id \
            and record.get("attempt", attempt) == attempt
    return keep


def _write_text(dest: int, access: Access, name: str, kind: str, data: bytes,
                limits: Limits) -> ArchivedFile:
    entry = ArchivedFile(name, kind, "", ARCHIVED, source_size=len(data))
    sink = _GzipSink(dest, name, access, limits.compress_level)
    if len(data) > limits.max_file_bytes:
        data, entry.truncated = data[-limits.max_file_bytes:], True
    sink.write(data)
    _finish(dest, sink, entry)
    return entry


# -- the archive file ----------------------------------------------------------------------
class _GzipSink:
    """A new archive file: gzip of what it is given, and the SHA-256 of the original bytes."""

    def __init__(self, parent: int, name: str, access: Access, level: int) -> None:
        self.raw = os.fdopen(create_file(parent, name, access), "wb")
        # mtime=0 and no file name: the same content always compresses to the same bytes
        self.gz = gzip.GzipFile(filename="", mode="wb", fileobj=self.raw,
                                compresslevel=min(9, max(1, level)), mtime=0)
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        self.gz.write(data)
        self.sha.update(data)
        self.size += len(data)

    def close(self) -> int:
        """Finish and fsync the file; returns its size on disk."""
        try:
            self.gz.close()
            self.raw.flush()
            os.fsync(self.raw.fileno())
            return os.fstat(self.raw.fileno()).st_size
        finally:
            self.raw.close()


def _finish(dest: int, sink: _GzipSink, entry: ArchivedFile) -> None:
    try:
        stored = sink.close()
    except OSError as exc:
        entry.status, entry.error = PARTIAL, f"writing the archive failed: {exc.strerror}"
        stored = 0
    if entry.status in (MISSING, REFUSED, SKIPPED) and sink.size == 0:
        with contextlib.suppress(OSError):
            os.unlink(entry.name, dir_fd=dest)  # nothing of it is archived: no empty file
        return
    entry.size, entry.stored, entry.sha256 = sink.size, stored, sink.sha.hexdigest()
