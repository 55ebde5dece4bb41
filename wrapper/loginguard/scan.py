"""The scan: what every watched user's processes are doing, for one read per process.

``psutil.process_iter`` lists the processes and keeps a Process object per pid for the
rare reads that need one (owner, command line). Per process and per scan the guard
reads only ``/proc/PID/stat``, kept open between scans (:class:`StatFiles`): name,
state, start time, CPU time and resident memory are all in that line. (``process_iter``
with attributes reads the same file, but its per-process overhead is as large as the
read itself: at 2,000 processes that decides whether a scan fits its budget;
``tests/bench/guard.py`` measures it.)
Everything else is cached per process and read again only when it can have changed:
owner and command line when the process execs (its name changes) or every
``REFRESH_SECONDS``; mapped libraries only after it has run (a library cannot load
without CPU time). Processes of root, system accounts and exempt users cost the one
read and nothing more.
"""

from __future__ import annotations

import os
import pwd
import resource
import time
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import psutil

from wrapper.loginguard.rules import Policy, ProcessSample, Snapshot, is_python

# Cached facts are re-read at least this often even for a process that never changed,
# so that a missed change (a uid switched without exec) heals.
REFRESH_SECONDS = 300.0
# Account lookups can go to LDAP/SSSD; a user's groups rarely change.
_ACCOUNT_SECONDS = 300.0
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# The kernel truncates a process's name to 15 characters (TASK_COMM_LEN - 1).
_COMM_MAX = 15


@dataclass
class _Known:
    """What the scanner remembers about one process between scans."""

    start: int  # start time in clock ticks since boot: with the pid, the identity
    comm: str  # the name as the kernel has it (an exec changes it)
    uid: int
    ignored: bool
    checked: float  # monotonic time the owner and command line were read
    create_time: float = 0.0
    name: str = ""  # comm, or the fuller name its command line gives
    user: str = ""
    cmdline: tuple[str, ...] = ()
    signature: str = ""
    python: bool = False
    session: bool = False
    cpu_ticks: int = 0  # CPU time at the last scan
    maps_ticks: int = -1  # CPU time when /proc/PID/maps was last read
    ai_library: str = ""
    sample: ProcessSample | None = None  # the last one, reused while nothing changes


@dataclass
class _Account:
    user: str
    gids: frozenset[int]
    looked_up: float


def raise_open_file_limit() -> int:
    """Lift this process's soft limit on open files to the hard one; returns the new soft.

    The entry point calls it (never an import): :class:`StatFiles` keeps a file open per
    process, and a login node can have thousands.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # the old limit stands; StatFiles keeps fewer files open
    return soft


# Open files left for everything else (the log, the state, psutil's reads, a notify pipe).
_FD_RESERVE = 256


class StatFiles:
    """``/proc/PID/stat`` of each process, kept open from one scan to the next.

    A ``pread`` on an open file costs less than half of open, read and close (the path
    lookup in procfs is the expensive part), and an open file stays bound to its
    process: once that one ends it reads nothing, even if the pid is reused, so a new
    process is always opened afresh. Beyond the open-file limit, files are opened and
    closed per read as usual.
    """

    def __init__(self, proc_root: str = "/proc", limit: int | None = None) -> None:
        self.proc_root = proc_root
        if limit is None:
            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - _FD_RESERVE
        self.limit = max(limit, 0)
        self._fds: dict[int, int] = {}
        self._finalizer = weakref.finalize(self, _close_all, self._fds)

    def read(self, pid: int) -> bytes | None:
        fd = self._fds.get(pid)
        if fd is not None:
            try:
                data = os.pread(fd, 4096, 0)
            except OSError:
                data = b""
            if data:
                return data
            del self._fds[pid]  # that process ended: the pid, if listed, is a new one
            os.close(fd)
        try:
            fd = os.open(f"{self.proc_root}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None  # gone since it was listed
        try:
            data = os.pread(fd, 4096, 0)
        except OSError:
            data = b""
        if data and len(self._fds) < self.limit:
            self._fds[pid] = fd
        else:
            os.close(fd)
        return data or None

    def keep_only(self, pids: Collection[int]) -> None:
        """Close the files of processes no longer listed."""
        for pid in [p for p in self._fds if p not in pids]:
            os.close(self._fds.pop(pid))

    def close(self) -> None:
        self._finalizer()

    def __len__(self) -> int:
        return len(self._fds)


def _close_all(fds: dict[int, int]) -> None:
    for fd in fds.values():
        os.close(fd)
    fds.clear()


def parse_stat(data: bytes) -> tuple[str, str, int, int, int] | None:
    """(name, state, start ticks, CPU ticks, resident pages) from a /proc/PID/stat line."""
    # The name is in parentheses and may itself hold spaces and parentheses.
    opened, closed = data.find(b"("), data.rfind(b")")
    if opened < 0 or closed < opened:
        return None
    rest = data[closed + 2:].split(None, 22)  # the fields up to rss, no further
    if len(rest) < 22:
        return None
    return (data[opened + 1:closed].decode(errors="replace"), rest[0].decode(),
            int(rest[19]), int(rest[11]) + int(rest[12]), int(rest[21]))


@dataclass
class Scanner:
    """Scans the processes of the node; keep one for the guard's lifetime (it caches)."""

    policy: Policy
    # Confines the guard to these pids (asked once per scan); None: every process. Tests
    # use it so that a guard they start can never touch what they did not start.
    scope: Callable[[], Collection[int]] | None = None
    proc_root: str = "/proc"
    monotonic: Callable[[], float] = time.monotonic
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    _known: dict[int, _Known] = field(default_factory=dict, repr=False)
    _accounts: dict[int, _Account] = field(default_factory=dict, repr=False)
    _last: float | None = field(default=None, repr=False)
    _last_tick: int | None = field(default=None, repr=False)
    _boot: float = field(default_factory=psutil.boot_time, repr=False)
    _stat_files: StatFiles | None = field(default=None, repr=False)

    @property
    def stat_files(self) -> StatFiles:
        if self._stat_files is None:
            self._stat_files = StatFiles(self.proc_root)
        return self._stat_files

    def close(self) -> None:
        """Close the files kept open between scans."""
        self.stat_files.close()

    def scan(self) -> Snapshot:
        now = self.monotonic()
        since_last = None if self._last is None else max(now - self._last, 1e-6)
        # Start times count clock ticks of CLOCK_BOOTTIME: one that started at or after
        # the previous scan's tick is new since then.
        fresh_from = self._last_tick
        self._last_tick = int(time.clock_gettime(time.CLOCK_BOOTTIME) * _CLOCK_TICKS)
        allowed = None if self.scope is None else frozenset(self.scope())
        seen: dict[int, _Known] = {}
        samples: list[ProcessSample] = []
        listed: set[int] = set()
        files = self.stat_files
        for proc in psutil.process_iter():
            pid = proc.pid
            listed.add(pid)
            if allowed is not None and pid not in allowed:
                continue
            data = files.read(pid)
            stat = None if data is None else parse_stat(data)
            if stat is None:
                continue
            comm, state, start, cpu_ticks, rss_pages = stat
            if state in ("Z", "X"):
                continue  # a zombie uses nothing and can be acted on by no one
            previous = self._known.get(pid)
            same = previous is not None and previous.start == start
            known = previous if same else None
            if known is None or known.comm != comm or now - known.checked > REFRESH_SECONDS:
                looked = self._identify(proc, comm, start, now)
                if looked is None:
                    continue
                if known is not None:
                    looked.cpu_ticks = known.cpu_ticks  # same process: keep its baseline
                    if known.comm == comm:
                        looked.ai_library = known.ai_library
                known = looked
            seen[pid] = known
            if known.ignored:
                known.cpu_ticks = cpu_ticks
                continue
            if same:
                ticks = cpu_ticks - known.cpu_ticks
            elif fresh_from is not None and start >= fresh_from:
                ticks = cpu_ticks  # started since the last scan: all its CPU is new
            else:
                ticks = 0  # first sight of an older process: nothing to compare with
            known.cpu_ticks = cpu_ticks
            if known.python and not known.ai_library and known.maps_ticks != cpu_ticks:
                self._check_libraries(known, pid, cpu_ticks)
            cores = max(ticks / _CLOCK_TICKS / since_last, 0.0) if since_last else 0.0
            rss = rss_pages * _PAGE_SIZE
            sample = known.sample
            # Most processes sleep: the sample of the last scan is still true of them.
            if (sample is None or cores or sample.cpu_cores or sample.rss != rss
                    or sample.ai_library != known.ai_library):
                sample = known.sample = ProcessSample(
                    pid=pid, create_time=known.create_time, uid=known.uid, user=known.user,
                    name=known.name, cmdline=known.cmdline, cpu_cores=cores, rss=rss,
                    signature=known.signature, ai_library=known.ai_library,
                    session=known.session)
            samples.append(sample)
        files.keep_only(listed)
        self._known = seen
        self._last = now
        return Snapshot(tuple(samples), self.cpus, since_last is not None,
                        since_last or 0.0, len(listed))

    def _identify(self, proc: psutil.Process, comm: str, start: int,
                  now: float) -> _Known | None:
        try:
            uid = int(proc.uids().real)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None
        account = self._account(uid, now)
        if self.policy.ignores_account(uid, account.user, account.gids):
            return _Known(start, comm, uid, ignored=True, checked=now)
        try:
            cmdline = tuple(proc.cmdline())
        except psutil.AccessDenied:
            cmdline = ()
        except psutil.NoSuchProcess:
            return None
        name = comm
        if len(comm) >= _COMM_MAX and cmdline:
            fuller = os.path.basename(cmdline[0])  # as psutil's name() does
            if fuller.startswith(comm):
                name = fuller
        # psutil's create_time, from the same start tick: actions compare the two.
        create_time = start / _CLOCK_TICKS + self._boot
        binary, system_binary = self._binary(proc.pid)
        # A renamed interpreter is still one: its libraries are checked all the same.
        python = (is_python(name) or is_python(binary or "")
                  or bool(cmdline and is_python(os.path.basename(cmdline[0]))))
        return _Known(start, comm, uid, ignored=False, checked=now, create_time=create_time,
                      name=name, user=account.user, cmdline=cmdline,
                      signature=self.policy.signature(name, cmdline), python=python,
                      session=self.policy.is_session(name, binary, system_binary))

    def _binary(self, pid: int) -> tuple[str | None, bool]:
        """The file name of a process's program and whether only root can change it.

        (None, False) when it cannot be read: a guard without CAP_SYS_PTRACE, or a
        process that just ended.
        """
        exe = f"{self.proc_root}/{pid}/exe"
        try:
            target = os.readlink(exe)
            info = os.stat(exe)  # the program itself, even if replaced on disk since
        except OSError:
            return None, False
        name = os.path.basename(target.removesuffix(" (deleted)"))
        return name, info.st_uid == 0 and not info.st_mode & 0o022

    def _account(self, uid: int, now: float) -> _Account:
        account = self._accounts.get(uid)
        if account is None or now - account.looked_up > _ACCOUNT_SECONDS:
            try:
                entry = pwd.getpwuid(uid)
                user = entry.pw_name
                gids = frozenset(os.getgrouplist(user, entry.pw_gid))
            except KeyError:
                user, gids = str(uid), frozenset()  # no passwd entry: a uid is all we know
            account = _Account(user, gids, now)
            self._accounts[uid] = account
        return account

    def _check_libraries(self, known: _Known, pid: int, cpu_ticks: int) -> None:
        """Look for AI libraries in a Python process's memory map."""
        known.maps_ticks = cpu_ticks
        if not self.policy.ai_libraries:
            return
        try:
            with open(f"{self.proc_root}/{pid}/maps", "rb") as handle:
                maps = handle.read()
        except OSError:
            return  # gone, or not ours to read (a guard running without CAP_SYS_PTRACE)
        for library in self.policy.ai_libraries:
            at = maps.find(b"/" + library.encode())
            if at >= 0:
                end = maps.find(b"\n", at)
                known.ai_library = os.path.basename(
                    maps[at:end if end >= 0 else None].decode(errors="replace"))
                return
