"""The copy engine: files at disk speed, many small files in parallel, each verified.

* Data moves with ``copy_file_range`` (in-kernel; a reflink where the file system can),
  else ``sendfile``, else big buffered reads: large files go at disk speed. Offsets are
  explicit, so one descriptor can serve several readers.
* Creating a file is what costs with small files, and creates in one folder serialize on
  its lock (threads fighting over it are slower than one). So small files are copied by
  folder, folders in parallel on a thread pool, and each large file is a task of its own.
* Every file is checked before anyone sees it: its size always, and with
  ``verify="sha256"`` the checksum of the bytes read against a read-back of the copy.
  A source that changed while being copied is refused (its size or mtime moved).
* Mode bits and mtimes are preserved (folders get theirs last, once filled).
* Free space is checked before anything is written; progress goes to a callback.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import field

from wrapper.errors import UserInputError
from wrapper.fastdataclass import dataclass
from wrapper.osl.dirs import DirTree
from wrapper.staging.errors import NoSpaceError, StagingError
from wrapper.staging.report import Progress, format_bytes
from wrapper.staging.tree import DIR, LINK, Entry, Manifest, sha256_fd

VERIFY_CHOICES = ("size", "sha256")
CHUNK = 64 << 20  # bytes per copy_file_range call: how often a large file reports progress
BUFFER = 4 << 20  # for the buffered fallback and for hashing
LARGE = 4 << 20  # a file this big is a parallel task of its own
_CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_FALLBACK = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class Meter:
    """Counts files and bytes from any thread; reports at most every ``interval`` s."""

    def __init__(self, directive: str, files_total: int, bytes_total: int,
                 report: Callable[[Progress], None] | None, *, interval: float = 1.0) -> None:
        self.directive = directive
        self.files_total = files_total
        self.bytes_total = bytes_total
        self.report = report
        self.interval = interval
        self.files = 0
        self.bytes = 0
        self.started = time.monotonic()
        self._last = self.started
        self._lock = threading.Lock()

    def add(self, *, files: int = 0, nbytes: int = 0) -> None:
        with self._lock:
            self.files += files
            self.bytes += nbytes
            now = time.monotonic()
            if self.report is not None and now - self._last >= self.interval:
                self._last = now
                self.report(self.snapshot(now))  # under the lock: reports stay in order

    def snapshot(self, now: float | None = None, *, done: bool = False) -> Progress:
        seconds = (now if now is not None else time.monotonic()) - self.started
        return Progress(directive=self.directive, files_done=self.files,
                        files_total=self.files_total, bytes_done=self.bytes,
                        bytes_total=self.bytes_total, seconds=round(seconds, 6), done=done)

    def finish(self) -> Progress:
        with self._lock:
            final = self.snapshot(done=True)
            if self.report is not None:
                self.report(final)
        return final


@dataclass(frozen=True)
class Copied:
    bytes: int
    sha256: str = ""


@dataclass
class TreeResult:
    files: int = 0
    bytes: int = 0
    checksums: dict[str, str] = field(default_factory=dict)  # path in the destination -> hex
    problems: list[str] = field(default_factory=list)  # with keep_going only

    def add(self, path: str, nbytes: int, digest: str) -> None:
        """Count one file placed at ``path`` (callers in threads hold their lock)."""
        self.files += 1
        self.bytes += nbytes
        if digest:
            self.checksums[path] = digest


def copy_data(src: int, dst: int, size: int, *, hasher: hashlib._Hash | None = None,
              on_bytes: Callable[[int], None] | None = None) -> int:
    """Copy ``size`` bytes from offset 0 of ``src`` to ``dst``; returns the bytes copied
    (fewer if the source was shorter). With a hasher the bytes pass through it."""
    done = 0
    if hasher is None:
        try:
            while done < size:
                count = os.copy_file_range(src, dst, min(CHUNK, size - done), done, done)
                if not count:
                    return done
                done += count
                if on_bytes:
                    on_bytes(count)
            return done
        except OSError as exc:
            if exc.errno not in _FALLBACK:
                raise
        try:
            os.lseek(dst, done, os.SEEK_SET)  # sendfile writes at dst's own position
            while done < size:
                count = os.sendfile(dst, src, done, min(CHUNK, size - done))
                if not count:
                    return done
                done += count
                if on_bytes:
                    on_bytes(count)
            return done
        except OSError as exc:
            if exc.errno not in _FALLBACK:
                raise
    buffer = bytearray(min(BUFFER, max(size - done, 1)))
    view = memoryview(buffer)
    while done < size:
        count = os.preadv(src, [view[:min(len(buffer), size - done)]], done)
        if not count:
            return done
        if hasher is not None:
            hasher.update(view[:count])
        written = 0
        while written < count:
            written += os.pwrite(dst, view[written:count], done + written)
        done += count
        if on_bytes:
            on_bytes(count)
    return done


def write_file(src: int, entry: Entry, dir_fd: int, name: str, *, label: str, mode: int,
               verify: str, owner: tuple[int, int] | None = None, replace: bool = False,
               durable: bool = False, same_inode: bool = True,
               on_bytes: Callable[[int], None] | None = None) -> Copied:
    """Copy one file into ``dir_fd``/``name`` and verify it; nothing is left on failure.

    Without ``replace`` the name must be new (``O_EXCL``: never write through something
    already there); with it the copy is written under a temporary name and renamed over
    the old one, so a reader never sees half a file. ``same_inode``: ``src`` is the very
    file the entry was scanned from, so its ctime must not have moved either (a user can
    set an mtime back, never a ctime); false when copying from the cache's own copy.
    """
    target = f".{name[:200]}.jobwrap-{os.urandom(4).hex()}" if replace else name
    try:
        # Made with its final mode (an owner to give it to comes first: 0600 till then),
        # so a small file costs no chmod unless the umask took bits away.
        fd = os.open(target, _CREATE, 0o600 if owner is not None else mode, dir_fd=dir_fd)
    except FileExistsError:
        raise UserInputError(f"{label!r} already exists (do two directives stage to the "
                             "same place?)") from None
    except OSError as exc:
        raise write_error(label, exc) from None
    try:
        hasher = hashlib.sha256() if verify == "sha256" else None
        done = copy_data(src, fd, entry.size, hasher=hasher, on_bytes=on_bytes)
        # checked after the copy, against the scan: catches a file replaced since the
        # scan as well as one written during the copy
        after = os.fstat(src)
        if done != entry.size or not stat.S_ISREG(after.st_mode) or (
                after.st_size, after.st_mtime_ns) != (entry.size, entry.mtime_ns) or (
                same_inode and after.st_ctime_ns != entry.ctime_ns):
            raise _changed(label)
        if owner is not None:
            os.fchown(fd, *owner)  # before chmod: chown clears set-id bits
        made = os.fstat(fd)
        if made.st_size != entry.size:
            raise StagingError(f"{label}: the copy has the wrong size after writing")
        if owner is not None or stat.S_IMODE(made.st_mode) != mode:
            os.fchmod(fd, mode)
        os.utime(fd, ns=(entry.mtime_ns, entry.mtime_ns))
        digest = ""
        if hasher is not None:
            digest = hasher.hexdigest()
            if sha256_fd(fd) != digest:
                raise StagingError(f"{label}: the copy does not match its source (sha256)")
        if durable:
            os.fdatasync(fd)
        if replace:
            os.rename(target, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException as exc:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(target, dir_fd=dir_fd)
        if isinstance(exc, OSError) and not isinstance(exc, FileExistsError):
            raise write_error(label, exc) from None
        raise
    os.close(fd)
    return Copied(done, digest)


def make_symlink(entry: Entry, dir_fd: int, name: str, *, label: str,
                 owner: tuple[int, int] | None = None, replace: bool = False) -> None:
    target = f".{name[:200]}.jobwrap-{os.urandom(4).hex()}" if replace else name
    try:
        os.symlink(entry.target, target, dir_fd=dir_fd)
    except FileExistsError:
        raise UserInputError(f"{label!r} already exists (do two directives stage to the "
                             "same place?)") from None
    try:
        if owner is not None:
            os.chown(target, *owner, dir_fd=dir_fd, follow_symlinks=False)
        os.utime(target, ns=(entry.mtime_ns, entry.mtime_ns), dir_fd=dir_fd,
                 follow_symlinks=False)
        if replace:
            os.rename(target, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(target, dir_fd=dir_fd)
        raise


def keep_mode(entry: Entry) -> int:
    return entry.mode & 0o777


def copy_tree(manifest: Manifest, open_source: Callable[[Entry], int], tree: DirTree,
              dest: str, *, verify: str, parallel: int, meter: Meter | None = None,
              file_mode: Callable[[Entry], int] = keep_mode,
              dir_mode: Callable[[Entry], int] = keep_mode,
              owner: tuple[int, int] | None = None, replace: bool = False,
              keep_going: bool = False, durable: bool = False) -> TreeResult:
    """Copy a manifest's tree to ``dest`` (relative to ``tree``; "" is its root).

    For a single-file manifest ``dest`` is the file's own path. Folders that existed
    before keep their mode and times; the ones made here get the source's. Stops at the
    first error, unless ``keep_going`` (stage-out): then it copies all it can and lists
    the problems.
    """
    if manifest.kind != DIR and not dest:
        raise UserInputError("a single file needs a name to be staged to")
    result = TreeResult()
    make_dirs(manifest, tree, dest)
    copy_files(manifest.files, open_source, tree, dest, result, verify=verify,
               parallel=parallel, meter=meter, file_mode=file_mode, owner=owner,
               replace=replace, keep_going=keep_going, durable=durable)
    make_links(manifest, tree, dest, result, owner=owner, replace=replace,
               keep_going=keep_going)
    finish_dirs(manifest, tree, dest, result, dir_mode=dir_mode, owner=owner,
                keep_going=keep_going, durable=durable)
    return result


def dest_path(dest: str, entry: Entry) -> str:
    """Where an entry lands, relative to the destination tree's root."""
    return "/".join(p for p in (dest, entry.path) if p)


def make_dirs(manifest: Manifest, tree: DirTree, dest: str) -> None:
    """Make (or open) every folder of the manifest, parents first."""
    if manifest.kind == DIR:
        for entry in manifest.entries:
            if entry.kind == DIR:
                tree.get(dest_path(dest, entry))


def copy_files(files: Sequence[Entry], open_source: Callable[[Entry], int], tree: DirTree,
               dest: str, result: TreeResult, *, verify: str, parallel: int,
               meter: Meter | None = None, file_mode: Callable[[Entry], int] = keep_mode,
               owner: tuple[int, int] | None = None, replace: bool = False,
               keep_going: bool = False, durable: bool = False) -> None:
    """Copy files (their folders exist) by folder in parallel; adds to ``result``."""
    lock = threading.Lock()
    on_bytes = (lambda n: meter.add(nbytes=n)) if meter else None
    prefix = f"{dest}/" if dest else ""

    def copy_one(entry: Entry) -> None:
        path = f"{prefix}{entry.path}" if entry.path else dest
        parent, _, name = path.rpartition("/")
        large = entry.size > CHUNK  # only a large file reports while it is copied
        src = open_source(entry)
        try:
            copied = write_file(src, entry, tree.get(parent), name, label=path,
                                mode=file_mode(entry), verify=verify, owner=owner,
                                replace=replace, durable=durable,
                                on_bytes=on_bytes if large else None)
        finally:
            os.close(src)
        _tally(result, lock, meter, path, copied, large)

    failures = for_each_by_folder(
        files, lambda e: (f"{prefix}{e.path}" if e.path else dest).rpartition("/")[0],
        copy_one, parallel=parallel, keep_going=keep_going)
    result.problems.extend(_problem(dest_path(dest, e), exc) for e, exc in failures)


OpenFiles = list[tuple[Entry, int]]  # files, each with an open descriptor of its source


def copy_batches(batches: Iterable[OpenFiles], tree: DirTree, dest: str,
                 result: TreeResult, *, verify: str, parallel: int,
                 meter: Meter | None = None, file_mode: Callable[[Entry], int] = keep_mode,
                 then: Callable[[Entry, Copied], None] | None = None,
                 backlog: int = 512) -> None:
    """Copy files from open descriptors (``batches`` of (entry, descriptor), consumed as
    they come: the sender prepares the next batch while these are copied); takes
    ownership of every descriptor. Each file is copied by ``write_file`` and then handed
    to ``then`` (the cache links it into the job's scratch there). Adds to ``result``.

    Files of one folder are copied in order by one thread at a time (creates in a folder
    serialize on its lock), folders in parallel, each large file on its own; at most
    ``backlog`` received descriptors wait. Raises the first failure, after the running
    copies stop; no descriptor is left open.
    """
    _BatchCopy(tree, dest, result, verify=verify, meter=meter, file_mode=file_mode,
               then=then, backlog=backlog).run(batches, parallel)


class _BatchCopy:
    """One ``copy_batches``. Each folder has one runner at a time, which copies its chunks
    in order (later chunks of the folder wait in ``waiting``); one condition guards the
    queues, the counts of descriptors ``held`` and runners ``running``, and the failures.
    """

    def __init__(self, tree: DirTree, dest: str, result: TreeResult, *, verify: str,
                 meter: Meter | None, file_mode: Callable[[Entry], int],
                 then: Callable[[Entry, Copied], None] | None, backlog: int) -> None:
        self.tree = tree
        self.dest = dest
        self.prefix = f"{dest}/" if dest else ""
        self.result = result
        self.verify = verify
        self.meter = meter
        self.on_bytes = (lambda n: meter.add(nbytes=n)) if meter else None
        self.file_mode = file_mode
        self.then = then
        self.backlog = backlog
        self.lock = threading.Condition()
        self.waiting: dict[str, list[OpenFiles]] = {}  # folder -> chunks behind its runner
        self.held = 0  # descriptors received and not yet closed
        self.running = 0  # runners submitted and not yet done
        self.failures: list[BaseException] = []

    def run(self, batches: Iterable[OpenFiles], parallel: int) -> None:
        workers = max(1, min(parallel, usable_cpus()))
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stage")
        try:
            for batch in batches:
                self.take(pool, batch)
                if not self.wait_for_room():
                    break
        except BaseException as exc:
            with self.lock:
                self.failures.append(exc)  # the runners stop (closing what they hold)
            raise
        finally:
            with self.lock:
                while self.running:
                    self.lock.wait()
            pool.shutdown(wait=True)
        if self.failures:
            raise self.failures[0]

    def take(self, pool: ThreadPoolExecutor, batch: OpenFiles) -> None:
        """Hand a received batch to the runners: by folder, each large file apart."""
        groups: dict[str | None, list[OpenFiles]] = {}
        for entry, fd in batch:
            if entry.size >= LARGE:
                groups.setdefault(None, []).append([(entry, fd)])
            else:
                folder = groups.setdefault(self.path(entry).rpartition("/")[0], [[]])
                folder[0].append((entry, fd))
        with self.lock:
            self.held += len(batch)
        for folder_name, chunks in groups.items():
            for chunk in chunks:
                self.submit(pool, folder_name, chunk)

    def wait_for_room(self) -> bool:
        """Past ``backlog`` held descriptors, wait till half are copied; False once a
        copy failed (nothing more is taken)."""
        with self.lock:
            if self.held > self.backlog:
                while self.held > self.backlog // 2 and self.running and not self.failures:
                    self.lock.wait()
            return not self.failures

    def submit(self, pool: ThreadPoolExecutor, folder: str | None, chunk: OpenFiles) -> None:
        """Queue ``chunk`` behind its folder's runner, or start one (a large file, None,
        always gets its own)."""
        with self.lock:
            if folder is not None and folder in self.waiting:
                self.waiting[folder].append(chunk)  # its runner takes it next
                return
            if folder is not None:
                self.waiting[folder] = []
            self.running += 1
        pool.submit(self.runner, folder, chunk)

    def runner(self, folder: str | None, chunk: OpenFiles) -> None:
        """Copy ``chunk``, then the folder's chunks queued meanwhile, in order."""
        queued: OpenFiles | None = chunk
        while queued is not None:
            self.copy_chunk(queued)
            queued = self.next_chunk(folder)

    def next_chunk(self, folder: str | None) -> OpenFiles | None:
        """The folder's next queued chunk; None when there is none (the runner ends)."""
        with self.lock:
            queued = self.waiting.get(folder) if folder is not None else None
            if queued:
                return queued.pop(0)
            if folder is not None:
                del self.waiting[folder]
            self.running -= 1
            self.lock.notify_all()
            return None

    def copy_chunk(self, chunk: OpenFiles) -> None:
        """Copy each file (none once a copy failed), closing every descriptor."""
        for i, (entry, src) in enumerate(chunk):
            try:
                if not self.failures:
                    self.copy_one(entry, src)
            except BaseException as exc:  # re-raised by ``run``
                with self.lock:
                    self.failures.append(exc)
            finally:
                os.close(src)
                chunk[i] = (entry, -1)
                with self.lock:
                    self.held -= 1
                    if self.held == self.backlog // 2:  # wake the receiver once, not per file
                        self.lock.notify_all()

    def copy_one(self, entry: Entry, src: int) -> None:
        path = self.path(entry)
        parent, _, name = path.rpartition("/")
        large = entry.size > CHUNK  # only a large file reports while it is copied
        copied = write_file(src, entry, self.tree.get(parent), name, label=path,
                            mode=self.file_mode(entry), verify=self.verify,
                            on_bytes=self.on_bytes if large else None)
        if self.then is not None:
            self.then(entry, copied)
        _tally(self.result, self.lock, self.meter, path, copied, large)

    def path(self, entry: Entry) -> str:
        """Where ``entry`` lands, relative to the tree's root."""
        return f"{self.prefix}{entry.path}" if entry.path else self.dest


def _tally(result: TreeResult, lock: threading.Lock | threading.Condition,
           meter: Meter | None, path: str, copied: Copied, large: bool) -> None:
    """Count a copied file in ``result`` (under ``lock``) and on ``meter`` (a large file
    has reported its bytes as it went)."""
    with lock:
        result.add(path, copied.bytes, copied.sha256)
    if meter:
        meter.add(files=1, nbytes=0 if large else copied.bytes)


def make_links(manifest: Manifest, tree: DirTree, dest: str, result: TreeResult, *,
               owner: tuple[int, int] | None = None, replace: bool = False,
               keep_going: bool = False) -> None:
    for entry in manifest.entries:
        if entry.kind != LINK:
            continue
        path = dest_path(dest, entry)
        parent, _, name = path.rpartition("/")
        try:
            make_symlink(entry, tree.get(parent), name, label=path, owner=owner,
                         replace=replace)
        except (OSError, UserInputError) as exc:
            if not keep_going:
                raise
            result.problems.append(_problem(path, exc))


def finish_dirs(manifest: Manifest, tree: DirTree, dest: str, result: TreeResult, *,
                dir_mode: Callable[[Entry], int] = keep_mode,
                owner: tuple[int, int] | None = None, keep_going: bool = False,
                durable: bool = False) -> None:
    """Give the folders this tree made their owner, mode and mtime, deepest first (a
    folder's mtime moves while it is filled). Folders that were there are left as is."""
    if manifest.kind != DIR:
        return
    made = set(tree.made)
    for entry in reversed(manifest.entries):
        rel = dest_path(dest, entry)
        if entry.kind != DIR or rel not in made:
            continue
        fd = tree.get(rel)
        try:
            if owner is not None:
                os.fchown(fd, *owner)
            os.fchmod(fd, dir_mode(entry))
            os.utime(fd, ns=(entry.mtime_ns, entry.mtime_ns))
            if durable:
                os.fsync(fd)
        except OSError as exc:
            if not keep_going:
                raise
            result.problems.append(_problem(rel, exc))


def for_each_by_folder(entries: Sequence[Entry], folder_of: Callable[[Entry], str],
                       work: Callable[[Entry], None], *, parallel: int,
                       keep_going: bool = False) -> list[tuple[Entry, BaseException]]:
    """Run ``work`` on every entry: one task per folder of small files (in order), one
    per large file, tasks in parallel, largest first. Returns the failures when
    ``keep_going``; otherwise raises the first one after the running tasks stop."""
    groups: dict[str, list[Entry]] = {}
    tasks: list[list[Entry]] = []
    for entry in entries:
        if entry.size >= LARGE:
            tasks.append([entry])
        else:
            groups.setdefault(folder_of(entry), []).append(entry)
    tasks.extend(groups.values())
    tasks.sort(key=lambda t: -sum(e.size for e in t))
    failures: list[tuple[Entry, BaseException]] = []
    stop = threading.Event()
    lock = threading.Lock()

    def run(task: list[Entry]) -> None:
        for entry in task:
            if stop.is_set():
                return
            try:
                work(entry)
            except Exception as exc:
                with lock:
                    failures.append((entry, exc))
                if not keep_going:
                    stop.set()
                    return

    # No more threads than CPUs: creating files is kernel work, and threads beyond the
    # CPUs only fight over the folder locks and the GIL (measured: 8 threads on 2 CPUs
    # copy 20,000 small files half as fast as 2).
    workers = max(1, min(parallel, len(tasks), usable_cpus()))
    if workers == 1:
        for task in tasks:
            run(task)
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stage") as pool:
            list(pool.map(run, tasks))
    if failures and not keep_going:
        raise failures[0][1]
    return failures


def sync_filesystem(fd: int) -> None:
    """Make everything written to ``fd``'s file system durable: one ``syncfs`` instead of
    an fsync per file (20,000 small files would wait for the disk 20,000 times).

    Linux 5.8 and later report a writeback error of any file here; without ``syncfs``
    (no libc symbol) the whole machine is synced instead.
    """
    import ctypes

    try:  # the C library already loaded in this process: nothing is searched or run
        syncfs = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):  # pragma: no cover - glibc and musl both have it
        os.sync()
        return
    if syncfs(ctypes.c_int(fd)) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity: a cgroup cpuset or taskset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except OSError:  # pragma: no cover - sched_getaffinity exists on Linux
        return max(1, os.cpu_count() or 1)


def space_needed(manifest: Manifest, dir_fd: int) -> int:
    return manifest.disk_bytes(os.fstatvfs(dir_fd).f_bsize)


def check_space(dir_fd: int, *, need: int, files: int, margin: int,
                where: str = "the node's local disk") -> None:
    """Refuse, before writing anything, data that would not fit (with ``margin`` kept).

    The message names both sizes; the caller puts the directive in front of it.
    """
    info = os.fstatvfs(dir_fd)
    free = info.f_bavail * info.f_frsize
    if need + margin > free:
        reserve = f" and {format_bytes(margin)} must stay free" if margin else ""
        raise UserInputError(f"the data needs {format_bytes(need)} but only "
                             f"{format_bytes(free)} is free on {where}{reserve}; stage less "
                             "data, or ask for a node with more local disk")
    if info.f_files and files > info.f_favail:
        raise UserInputError(f"the data has {files} files but {where} has room for only "
                             f"{info.f_favail} more; pack them into an archive "
                             "(--stage-in=SRC.tar:DEST:unpack) or stage fewer")


def _changed(label: str) -> UserInputError:
    return UserInputError(f"{label!r} changed while it was being staged; stage data that is "
                          "not being written")


def write_error(label: str, exc: OSError) -> Exception:
    """The error a user reads for a write that failed (theirs to fix, or ours)."""
    if exc.errno == errno.EEXIST:
        return UserInputError(f"{label!r} already exists (do two directives stage to the "
                              "same place?)")
    if exc.errno in _NO_SPACE:
        return NoSpaceError(f"no space left while writing {label!r} ({exc.strerror}); "
                              "stage less data, or ask for a node with more local disk")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return UserInputError(f"cannot write {label!r}: permission denied for the job's user")
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR):
        return UserInputError(f"cannot write {label!r}: something else is in the way")
    return StagingError(f"cannot write {label!r}: {exc.strerror}")


def _problem(path: str, exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return f"{path}: {exc.strerror or exc}"
    return str(exc)  # our own errors name the path already


