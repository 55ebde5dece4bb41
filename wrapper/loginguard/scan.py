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

Exemptions (an exempt command's allowance, a shell's protection) rest on the program a
process runs, never on its name: see :mod:`wrapper.loginguard.trust`.

CPU of processes that live shorter than a scan interval: a scan sees only the processes
alive at that moment, so a user starting many short burners would go unseen. Two
measures cover them.

- Children: ``/proc/PID/stat`` also holds the CPU of a process's children that ended
  and that it waited for (cutime + cstime). Its growth is counted for the parent (as
  ``children_cores``), less what earlier scans already counted of those children while
  they were alive. Children whose parent ended first go to a reaper (init, a
  subreaper): when that is not a watched process of theirs, their CPU is missed. The
  rules count ended children under their parent's rule: a real ``make``'s recipes
  within make's allowance, anything else's in the general share.
- The user's cgroup: where ``<cgroup_root>/user.slice/user-UID.slice/cpu.stat`` exists
  (cgroup v2 under systemd-logind), its ``usage_usec`` counts every process of the
  user's sessions, short-lived and orphaned ones included; what it shows beyond the
  processes' own readings is ``unseen`` CPU. Processes a user runs outside their slice
  (a service, another slice) are counted only through the first measure.
"""

from __future__ import annotations

import os
import pwd
import resource
import time
import weakref
from collections.abc import Callable, Collection
from dataclasses import field

import psutil

from wrapper.fastdataclass import dataclass
from wrapper.loginguard.rules import Policy, ProcessSample, Snapshot, is_python
from wrapper.loginguard.trust import ENVIRON_MAX, Trust

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
    child_ticks: int = 0  # CPU time of its ended children it waited for, at the last scan
    ppid: int = 0
    maps_ticks: int = -1  # CPU time when /proc/PID/maps was last read
    ai_library: str = ""
    exempt: str = ""  # the exempt command its program is, while it loads nothing foreign
    foreign: str = ""  # code or a loader setting not root's: no exemption, no protection
    sample: ProcessSample | None = None  # the last one, reused while nothing changes

    @property
    def candidate(self) -> bool:
        """An exemption depends on what it maps: its memory map must be watched."""
        return bool(self.exempt or self.session)


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


@dataclass(frozen=True)
class Stat:
    """The fields of one /proc/PID/stat line the guard uses."""

    name: str
    state: str
    ppid: int
    start: int  # clock ticks since boot
    cpu_ticks: int  # utime + stime
    child_ticks: int  # cutime + cstime: ended children it waited for
    rss_pages: int


def parse_stat(data: bytes) -> Stat | None:
    """The fields of a /proc/PID/stat line, or None when it is not one."""
    # The name is in parentheses and may itself hold spaces and parentheses.
    opened, closed = data.find(b"("), data.rfind(b")")
    if opened < 0 or closed < opened:
        return None
    rest = data[closed + 2:].split(None, 22)  # the fields up to rss, no further
    if len(rest) < 22:
        return None
    try:
        return Stat(data[opened + 1:closed].decode(errors="replace"), rest[0].decode(),
                    int(rest[1]), int(rest[19]), int(rest[11]) + int(rest[12]),
                    max(int(rest[13]) + int(rest[14]), 0), int(rest[21]))
    except (ValueError, UnicodeDecodeError):
        return None


@dataclass
class Scanner:
    """Scans the processes of the node; keep one for the guard's lifetime (it caches)."""

    policy: Policy
    # Confines the guard to these pids (asked once per scan); None: every process. Tests
    # use it so that a guard they start can never touch what they did not start.
    scope: Callable[[], Collection[int]] | None = None
    proc_root: str = "/proc"
    cgroup_root: str = "/sys/fs/cgroup"
    monotonic: Callable[[], float] = time.monotonic
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    _known: dict[int, _Known] = field(default_factory=dict, repr=False)
    _accounts: dict[int, _Account] = field(default_factory=dict, repr=False)
    _last: float | None = field(default=None, repr=False)
    _last_tick: int | None = field(default=None, repr=False)
    _boot: float = field(default_factory=psutil.boot_time, repr=False)
    _stat_files: StatFiles | None = field(default=None, repr=False)
    _trust: Trust = field(default_factory=Trust, repr=False)
    _exempt_files: dict[tuple[int, int], str] = field(default_factory=dict, repr=False)
    _exempt_at: float | None = field(default=None, repr=False)
    _usage: dict[int, int] = field(default_factory=dict, repr=False)  # cgroup usage_usec

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
        if self._exempt_at is None or now - self._exempt_at > REFRESH_SECONDS:
            self._exempt_files = self._trust.resolve(self.policy.allowances,
                                                     self.policy.exempt_path)
            self._exempt_at = now
        seen: dict[int, _Known] = {}
        measured: list[tuple[int, _Known, int, int, int]] = []
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
            previous = self._known.get(pid)
            same = previous is not None and previous.start == stat.start
            if stat.state in ("Z", "X"):
                # Ended, not yet waited for: it uses nothing and can be acted on by no
                # one, but its CPU is still to come in its parent's children's time.
                if previous is not None and same:
                    seen[pid] = previous
                continue
            known = previous if same else None
            comm = stat.name
            if known is None or known.comm != comm or now - known.checked > REFRESH_SECONDS:
                looked = self._identify(proc, comm, stat.start, now)
                if looked is None:
                    continue
                if known is not None:  # same process: keep its baselines
                    looked.cpu_ticks, looked.child_ticks = known.cpu_ticks, known.child_ticks
                    if known.comm == comm:
                        looked.ai_library = known.ai_library
                known = looked
            seen[pid] = known
            known.ppid = stat.ppid
            if known.ignored:
                known.cpu_ticks, known.child_ticks = stat.cpu_ticks, stat.child_ticks
                continue
            if same:
                ticks = stat.cpu_ticks - known.cpu_ticks
                child_ticks = stat.child_ticks - known.child_ticks
            elif fresh_from is not None and stat.start >= fresh_from:
                # started since the last scan: all its CPU is new
                ticks, child_ticks = stat.cpu_ticks, stat.child_ticks
            else:
                ticks = child_ticks = 0  # first sight of an older process: no baseline
            known.cpu_ticks, known.child_ticks = stat.cpu_ticks, stat.child_ticks
            if ((known.candidate or (known.python and not known.ai_library))
                    and known.maps_ticks != stat.cpu_ticks):
                self._check_libraries(known, pid, stat.cpu_ticks)
            measured.append((pid, known, ticks, child_ticks, stat.rss_pages))
        files.keep_only(listed)
        counted = self._counted_children(seen)
        samples: list[ProcessSample] = []
        own: dict[int, int] = {}
        for pid, known, ticks, child_ticks, rss_pages in measured:
            child_ticks = max(child_ticks - counted.get(pid, 0), 0)
            own[known.uid] = own.get(known.uid, 0) + ticks + child_ticks
            cores = max(ticks / _CLOCK_TICKS / since_last, 0.0) if since_last else 0.0
            children = child_ticks / _CLOCK_TICKS / since_last if since_last else 0.0
            rss = rss_pages * _PAGE_SIZE
            exempt = "" if known.foreign else known.exempt
            session = (known.session and not known.foreign
                       and cores <= self.policy.session_cpu_cores)
            sample = known.sample
            # Most processes sleep: the sample of the last scan is still true of them.
            if (sample is None or cores or sample.cpu_cores or children
                    or sample.children_cores or sample.rss != rss
                    or sample.ai_library != known.ai_library or sample.session != session
                    or sample.exempt != exempt):
                sample = known.sample = ProcessSample(
                    pid=pid, create_time=known.create_time, uid=known.uid, user=known.user,
                    name=known.name, cmdline=known.cmdline, cpu_cores=cores, rss=rss,
                    signature=known.signature, ai_library=known.ai_library,
                    session=session, exempt=exempt, children_cores=children)
            samples.append(sample)
        unseen = self._unseen(own, since_last)
        self._known = seen
        self._last = now
        return Snapshot(tuple(samples), self.cpus, since_last is not None,
                        since_last or 0.0, len(listed), unseen)

    def _counted_children(self, seen: dict[int, _Known]) -> dict[int, int]:
        """Per parent pid, the ticks earlier scans counted of its children that ended since.

        Its children's time grew by their whole CPU when it waited for them; the part
        already counted while they were alive is taken off again.
        """
        counted: dict[int, int] = {}
        for pid, old in self._known.items():
            if old.ignored or seen.get(pid) is old:
                continue
            parent = seen.get(old.ppid)
            if (parent is not None and parent is self._known.get(old.ppid)
                    and parent.uid == old.uid and not parent.ignored):
                counted[old.ppid] = counted.get(old.ppid, 0) + old.cpu_ticks + old.child_ticks
        return counted

    def _unseen(self, own: dict[int, int], since_last: float | None) -> dict[int, float]:
        """Per uid, cores the user's cgroup used beyond what its processes show."""
        unseen: dict[int, float] = {}
        usage: dict[int, int] = {}
        for uid, ticks in own.items():
            now_usec = self._cgroup_usage(uid)
            if now_usec is None:
                continue
            usage[uid] = now_usec
            before = self._usage.get(uid)
            if before is None or not since_last:
                continue
            extra = (now_usec - before) / 1e6 - ticks / _CLOCK_TICKS
            if extra > 0:
                unseen[uid] = extra / since_last
        self._usage = usage
        return unseen

    def _cgroup_usage(self, uid: int) -> int | None:
        path = f"{self.cgroup_root}/user.slice/user-{uid}.slice/cpu.stat"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            data = os.read(fd, 4096)
        except OSError:
            return None
        finally:
            os.close(fd)
        for line in data.splitlines():
            key, _, value = line.partition(b" ")
            if key == b"usage_usec" and value.strip().isdigit():
                return int(value)
        return None

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
        path, identity = self._trust.program(self.proc_root, proc.pid)
        binary = os.path.basename(path) if path else None
        # A renamed interpreter is still one: its libraries are checked all the same.
        python = (is_python(name) or is_python(binary or "")
                  or bool(cmdline and is_python(os.path.basename(cmdline[0]))))
        exempt = ""
        if identity is not None:
            exempt = self._exempt_files.get(identity, "")
            if not exempt and binary in self.policy.allowances:
                exempt = binary or ""
        known = _Known(start, comm, uid, ignored=False, checked=now, create_time=create_time,
                       name=name, user=account.user, cmdline=cmdline,
                       signature=self.policy.signature(name, cmdline), python=python,
                       session=self.policy.is_session(name, binary, identity is not None),
                       exempt=exempt)
        if known.candidate:
            known.foreign = self._loader_setting(proc.pid)
        return known

    def _loader_setting(self, pid: int) -> str:
        """A loader variable of the process's environment that names a user's files."""
        try:
            fd = os.open(f"{self.proc_root}/{pid}/environ", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return ""  # gone, or not ours to read: its memory map is checked all the same
        try:
            environ = os.read(fd, ENVIRON_MAX)
        except OSError:
            environ = b""
        finally:
            os.close(fd)
        return self._trust.foreign_loader_setting(environ)

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
        """Look for AI libraries in a Python process's memory map, and for code not
        root's in that of an exempt command or a shell."""
        known.maps_ticks = cpu_ticks
        checks_ai = known.python and not known.ai_library and self.policy.ai_libraries
        if not checks_ai and not (known.candidate and not known.foreign):
            return
        try:
            with open(f"{self.proc_root}/{pid}/maps", "rb") as handle:
                maps = handle.read()
        except OSError:
            return  # gone, or not ours to read (a guard running without CAP_SYS_PTRACE)
        if known.candidate and not known.foreign:
            known.foreign = self._trust.foreign_code(maps)
        if not checks_ai:
            return
        for library in self.policy.ai_libraries:
            at = maps.find(b"/" + library.encode())
            if at >= 0:
                end = maps.find(b"\n", at)
                known.ai_library = os.path.basename(
                    maps[at:end if end >= 0 else None].decode(errors="replace"))
                return
