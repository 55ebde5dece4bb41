"""The guard's steps: warn, throttle (and lift it), terminate, kill; in a dry run, none of them.

Every step re-checks each process it is about to touch (same pid, same start time, same
owner, same name as the scan saw), so a reused pid or an exec since the scan is never
hit. Each step returns an :class:`ActionRecord`; the guard audits it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import field
from pathlib import Path
from typing import Any

import psutil

from wrapper.errors import CommandError
from wrapper.fastdataclass import dataclass
from wrapper.loginguard.rules import Finding, ProcRef
from wrapper.loginguard.state import ActionRecord, PendingKill, Reniced, Throttle
from wrapper.runner import Runner

CPU_PERIOD_US = 100_000
# cpu.max rejects quotas under 1 ms per period.
MIN_QUOTA_US = 1_000
# The notify command must not hold the scans back behind a slow mail server.
NOTIFY_TIMEOUT = 10.0
# Never signalled whatever a rule says: the kernel's and init's pids.
_NEVER = frozenset({0, 1})


def cpu_max_file(cgroup_root: str, uid: int) -> Path:
    return Path(cgroup_root) / "user.slice" / f"user-{uid}.slice" / "cpu.max"


@dataclass
class Actions:
    """Carries out steps against live processes; ``dry_run`` turns every one into a report."""

    cgroup_root: str = "/sys/fs/cgroup"
    throttle_cpu_share: float = 0.02
    throttle_nice: int = 19
    notify_command: tuple[str, ...] = ()
    dry_run: bool = False
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    runner: Runner = field(default_factory=Runner)
    clock: Callable[[], float] = time.time
    log: Any = None

    def _record(self, action: str, user: str, uid: int, rule: str,
                pids: Iterable[int], seen: str, detail: str, ok: bool = True) -> ActionRecord:
        return ActionRecord(ts=self.clock(), action=action, user=user, uid=uid,
                            rule=rule, pids=tuple(pids), seen=seen, detail=detail,
                            dry_run=self.dry_run, ok=ok)

    # -- warn ---------------------------------------------------------------------------

    def warn(self, finding: Finding, message: str, user_pids: Iterable[ProcRef]) -> ActionRecord:
        """Write the message to every terminal the user has open here, then notify."""
        terminals = sorted(user_terminals(finding.uid, user_pids))
        if self.dry_run:
            return self._record("warn", finding.user, finding.uid, finding.rule,
                                [t.pid for t in finding.targets], finding.seen,
                                f"would write to {len(terminals)} terminal(s)")
        reached = [t for t in terminals if write_terminal(t, finding.uid, message)]
        self.notify("warn", finding, message)
        return self._record("warn", finding.user, finding.uid, finding.rule,
                            [t.pid for t in finding.targets], finding.seen,
                            f"message written to {len(reached)} of {len(terminals)} "
                            f"terminal(s): {', '.join(reached) or 'none'}")

    def tell(self, action: str, finding: Finding, message: str,
             user_pids: Iterable[ProcRef]) -> None:
        """The message that goes with a throttle or a termination: terminals and notify."""
        if self.dry_run:
            return
        for terminal in sorted(user_terminals(finding.uid, user_pids)):
            write_terminal(terminal, finding.uid, message)
        self.notify(action, finding, message)

    def notify(self, action: str, finding: Finding, message: str) -> None:
        if not self.notify_command or self.dry_run:
            return
        values = {"{user}": finding.user, "{uid}": str(finding.uid), "{rule}": finding.rule,
                  "{action}": action}
        argv = []
        for arg in self.notify_command:
            for token, value in values.items():
                arg = arg.replace(token, value)
            argv.append(arg)
        try:
            self.runner.run(argv, timeout=NOTIFY_TIMEOUT, input=message)
        except CommandError as exc:
            if self.log is not None:
                self.log.warning("login_guard.notify_failed", error=str(exc),
                                 user=finding.user, rule=finding.rule, action=action)

    # -- throttle -----------------------------------------------------------------------

    def throttle(self, finding: Finding, current: Throttle | None
                 ) -> tuple[ActionRecord, Throttle | None]:
        """cpu.max on the user's slice where it exists, else renice the offenders."""
        cpu_max = cpu_max_file(self.cgroup_root, finding.uid)
        quota = max(MIN_QUOTA_US, int(self.throttle_cpu_share * self.cpus * CPU_PERIOD_US))
        value = f"{quota} {CPU_PERIOD_US}"
        pids = [t.pid for t in finding.targets]
        if current is not None and current.method == "cgroup":
            return self._record("throttle", finding.user, finding.uid, finding.rule, pids,
                                finding.seen, f"already capped by {current.cgroup_file}"), current
        if current is None and _is_plain_file(cpu_max):
            if self.dry_run:
                return self._record("throttle", finding.user, finding.uid, finding.rule, pids,
                                    finding.seen, f"would write {value!r} to {cpu_max}"), None
            try:
                previous = _read_small(cpu_max)
                _write_small(cpu_max, value)
            except OSError as exc:
                return self._record("throttle", finding.user, finding.uid, finding.rule, pids,
                                    finding.seen, f"cannot write {cpu_max}: {exc.strerror}",
                                    ok=False), None
            throttle = Throttle(finding.uid, finding.user, "cgroup", self.clock(),
                                cgroup_file=str(cpu_max), previous_max=previous)
            return self._record("throttle", finding.user, finding.uid, finding.rule, pids,
                                finding.seen, f"wrote {value!r} to {cpu_max} (was "
                                f"{previous!r})"), throttle
        if self.dry_run:
            return self._record("throttle", finding.user, finding.uid, finding.rule, pids,
                                finding.seen, f"would renice to {self.throttle_nice}"), current
        throttle = current or Throttle(finding.uid, finding.user, "renice", self.clock())
        done, failed = [], []
        for ref in finding.targets:
            proc = same_process(ref, finding.uid)
            if proc is None:
                continue
            try:
                before = int(proc.nice())
                if before < self.throttle_nice:
                    proc.nice(self.throttle_nice)
                    throttle.reniced.append(Reniced(ref.pid, ref.create_time, before))
                done.append(ref.pid)
            except psutil.NoSuchProcess:
                continue
            except psutil.AccessDenied:
                failed.append(ref.pid)
        detail = f"reniced {done or 'nothing'} to {self.throttle_nice}"
        if failed:
            detail += f"; not allowed for {failed}"
        return self._record("throttle", finding.user, finding.uid, finding.rule, done,
                            finding.seen, detail, ok=not failed), throttle

    def unthrottle(self, throttle: Throttle, why: str) -> ActionRecord:
        """Undo a throttle exactly as it was done."""
        if self.dry_run:
            return self._record("unthrottle", throttle.user, throttle.uid, "", (), why,
                                f"would lift the {throttle.method} throttle")
        if throttle.method == "cgroup":
            path = Path(throttle.cgroup_file)
            value = throttle.previous_max or f"max {CPU_PERIOD_US}"
            try:
                if _is_plain_file(path):  # the slice ends when the user logs out
                    _write_small(path, value)
            except OSError as exc:
                return self._record("unthrottle", throttle.user, throttle.uid, "", (), why,
                                    f"cannot write {path}: {exc.strerror}", ok=False)
            return self._record("unthrottle", throttle.user, throttle.uid, "", (), why,
                                f"wrote {value!r} back to {path}")
        restored = []
        for item in throttle.reniced:
            proc = same_process(ProcRef(item.pid, item.create_time, ""), throttle.uid)
            if proc is None:
                continue
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                if proc.nice() == self.throttle_nice:  # the user may have changed it since
                    proc.nice(item.previous)
                    restored.append(item.pid)
        return self._record("unthrottle", throttle.user, throttle.uid, "", restored, why,
                            f"priority restored for {restored or 'no live process'}")

    # -- terminate ----------------------------------------------------------------------

    def terminate(self, finding: Finding, grace: float
                  ) -> tuple[ActionRecord, list[PendingKill]]:
        """SIGTERM to the finding's processes; each becomes a pending SIGKILL after ``grace``."""
        pids = [t.pid for t in finding.targets]
        if not finding.targets:
            return self._record("terminate", finding.user, finding.uid, finding.rule, (),
                                finding.seen, "nothing to terminate (only protected or "
                                "idle processes)"), []
        if self.dry_run:
            return self._record("terminate", finding.user, finding.uid, finding.rule, pids,
                                finding.seen, f"would send SIGTERM, then SIGKILL after "
                                f"{grace:g} s"), []
        signalled, pending = [], []
        for ref in finding.targets:
            proc = same_process(ref, finding.uid)
            if proc is None:
                continue
            # AccessDenied: a guard without the right to signal it (not root) goes on.
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                proc.send_signal(signal.SIGTERM)
                signalled.append(ref.pid)
                pending.append(PendingKill(ref.pid, ref.create_time, finding.uid,
                                           finding.user, finding.rule, self.clock() + grace))
        return self._record("terminate", finding.user, finding.uid, finding.rule, signalled,
                            finding.seen, f"SIGTERM sent to {signalled or 'no live process'}; "
                            f"SIGKILL after {grace:g} s"), pending

    def kill(self, pending: PendingKill) -> ActionRecord | None:
        """SIGKILL a process that outlived its grace; None when it had already gone."""
        proc = same_process(ProcRef(pending.pid, pending.create_time, ""), pending.uid)
        if proc is None:
            return None
        if self.dry_run:
            return self._record("kill", pending.user, pending.uid, pending.rule,
                                (pending.pid,), "", "would send SIGKILL")
        try:
            proc.send_signal(signal.SIGKILL)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None
        return self._record("kill", pending.user, pending.uid, pending.rule, (pending.pid,),
                            "", "SIGKILL sent: it outlived SIGTERM's grace")


def same_process(ref: ProcRef, uid: int) -> psutil.Process | None:
    """The process ``ref`` names if it is still that one, owned by ``uid``; else None."""
    if ref.pid in _NEVER or ref.pid == os.getpid():
        return None
    try:
        proc = psutil.Process(ref.pid)
        with proc.oneshot():
            if abs(proc.create_time() - ref.create_time) > 0.01:
                return None
            if proc.uids().real != uid or uid == 0:
                return None
            if ref.name and proc.name() != ref.name:
                return None
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return proc


def user_terminals(uid: int, refs: Iterable[ProcRef]) -> set[str]:
    """The terminals (``/dev/pts/N``, ``/dev/ttyN``) the user's processes have open here."""
    found = set()
    for ref in refs:
        proc = same_process(ref, uid)
        if proc is None:
            continue
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            terminal = proc.terminal()
            if terminal:
                found.add(terminal)
    return found


def write_terminal(path: str, uid: int, message: str) -> bool:
    """Write to a terminal only if it is a character device the user owns; never block."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_NOFOLLOW
                     | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISCHR(info.st_mode) or info.st_uid != uid:
            return False
        data = ("\r\n" + message.replace("\n", "\r\n") + "\r\n").encode(errors="replace")
        try:
            os.write(fd, data)
        except OSError:
            return False  # a full or hung-up terminal: the log still has the message
        return True
    finally:
        os.close(fd)


def _is_plain_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _read_small(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096).decode(errors="replace").strip()
    finally:
        os.close(fd)


def _write_small(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, (value + "\n").encode())
    finally:
        os.close(fd)
