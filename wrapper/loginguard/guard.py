"""One guard cycle (scan, judge, climb each violation's ladder, act, save) and the loop of them.

Per user and per rule a violation has a clock: it starts at the first scan that sees
the rule broken and must be seen at every scan for the rule's window (that is what
sustained means; one scan without it starts the window again). Then it takes one step
of the rule's ladder (warn, throttle, terminate, as configured) each ``escalate_after``
seconds while the violation goes on, repeating the last step; from its first step on,
it is forgiven (and any throttle lifted) only once unseen for ``forgive_after``
seconds, so that stopping for a moment does not reset the ladder. Clocks are
wall-clock times saved after every cycle, so a restart of the guard resumes them.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import psutil

from wrapper import log as jlog
from wrapper.config import Config
from wrapper.fastdataclass import dataclass
from wrapper.loginguard.actions import Actions
from wrapper.loginguard.gpu import GpuPidSource, GpuProbeError, gpu_pid_source
from wrapper.loginguard.rules import TITLES, Finding, Policy, ProcRef, evaluate
from wrapper.loginguard.scan import Scanner
from wrapper.loginguard.state import (
    ActionRecord,
    StateStore,
    Violation,
    violation_key,
)
from wrapper.runner import Runner

# With --once, CPU use is measured over this pause between two scans: one scan alone
# cannot tell a burner from a process that was busy once, long ago.
ONCE_SAMPLE_SECONDS = 1.0
_PAST = {"warn": "warned", "throttle": "throttled", "terminate": "terminated"}


def guard_pids() -> frozenset[int]:
    """The guard's own process and its ancestors: never a target, whoever owns them."""
    me = psutil.Process()
    return frozenset({me.pid, *(p.pid for p in me.parents())})


@dataclass(frozen=True)
class CycleReport:
    processes: int
    watched: int  # processes of users the rules apply to
    findings: tuple[Finding, ...]
    actions: tuple[ActionRecord, ...]
    scan_cpu_seconds: float


class Guard:
    """The login guard of one node. Tests drive :meth:`cycle` with their own clock."""

    def __init__(self, config: Config, *, dry_run: bool = False,
                 gpu_pids: GpuPidSource | None = None, clock: Callable[[], float] = time.time,
                 store: StateStore | None = None, own_pids: Collection[int] | None = None,
                 runner: Runner | None = None,
                 scope: Callable[[], Collection[int]] | None = None) -> None:
        self.config = config
        self.settings = config.login_guard
        self.dry_run = dry_run
        self.clock = clock
        self.log = jlog.get()
        self.policy = Policy.from_config(self.settings, config.source,
                                         guard_pids() if own_pids is None else own_pids)
        self.scanner = Scanner(self.policy, scope=scope,
                               cgroup_root=self.settings.cgroup_root)
        self.gpu_pids = gpu_pids if gpu_pids is not None else gpu_pid_source(config)
        self.store = store or StateStore(Path(config.paths.state_dir) / "login-guard")
        self.state, problem = self.store.load()
        if problem:
            self.log.error("login_guard.state_damaged", detail=problem)
        self.actions = Actions(
            cgroup_root=self.settings.cgroup_root,
            throttle_cpu_share=self.settings.throttle_cpu_share,
            throttle_nice=self.settings.throttle_nice,
            notify_command=tuple(self.settings.notify_command), dry_run=dry_run,
            cpus=self.scanner.cpus, runner=runner or Runner(), clock=clock, log=self.log)
        self._stop = threading.Event()

    # -- one cycle ----------------------------------------------------------------------

    def cycle(self) -> CycleReport:
        started = time.process_time()
        snapshot = self.scanner.scan()
        gpu = self._gpu_pids()
        capped = {uid for uid, t in self.state.throttles.items() if t.method == "cgroup"}
        findings = evaluate(snapshot, self.policy, gpu, capped)
        scan_cpu = time.process_time() - started
        now = self.clock()
        refs: dict[int, list[ProcRef]] = defaultdict(list)
        for sample in snapshot.samples:
            refs[sample.uid].append(sample.ref)
        records = self.finish_kills(now)
        for finding in findings:
            records.extend(self._escalate(finding, now, refs[finding.uid]))
        unknown = {"gpu"} if gpu is None else set()
        if not snapshot.measured:
            unknown.add("cpu")
        records.extend(self._forgive(now, {violation_key(f.uid, f.rule) for f in findings},
                                     unknown))
        self.save()
        self.log.debug("login_guard.cycle", processes=snapshot.processes,
                       watched=len(snapshot.samples), findings=len(findings),
                       actions=len(records), scan_ms=round(scan_cpu * 1000, 2))
        return CycleReport(snapshot.processes, len(snapshot.samples), tuple(findings),
                           tuple(records), scan_cpu)

    def save(self) -> None:
        if not self.dry_run:  # a dry run must leave no trace a real run would act on
            self.store.save(self.state)

    def _gpu_pids(self) -> set[int] | None:
        try:
            return self.gpu_pids()
        except GpuProbeError as exc:
            self.log.warning("login_guard.gpu_probe_failed", error=str(exc))
            return None

    def _escalate(self, finding: Finding, now: float, user_refs: list[ProcRef]
                  ) -> list[ActionRecord]:
        key = violation_key(finding.uid, finding.rule)
        violation = self.state.violations.get(key)
        if violation is None:
            violation = Violation(finding.uid, finding.user, finding.rule, finding.kind,
                                  since=now, last_seen=now, seen=finding.seen)
            self.state.violations[key] = violation
            # Not yet an offence: only sustained for its window does it become one.
            self.log.debug("login_guard.violation", user=finding.user, uid=finding.uid,
                           rule=finding.rule, seen=finding.seen, dry_run=self.dry_run)
        violation.last_seen, violation.seen = now, finding.seen
        ladder = self.policy.ladder(finding.kind)
        if not ladder or now - violation.since < self.policy.window(finding.kind):
            return []
        if violation.stage > 0 and now - violation.stage_at < self.settings.escalate_after:
            return []
        step = ladder[min(violation.stage, len(ladder) - 1)]
        following = ladder[violation.stage + 1] if violation.stage + 1 < len(ladder) else ""
        message = self.message(finding, violation, step, following, now)
        records = self._take(step, finding, message, user_refs)
        violation.stage += 1
        violation.stage_at = now
        violation.last_action = step
        return records

    def _take(self, step: str, finding: Finding, message: str, user_refs: list[ProcRef]
              ) -> list[ActionRecord]:
        if step == "warn":
            return [self._audit(self.actions.warn(finding, message, user_refs))]
        if step == "throttle":
            self.actions.tell("throttle", finding, message, user_refs)
            record, throttle = self.actions.throttle(finding,
                                                     self.state.throttles.get(finding.uid))
            if throttle is not None:
                self.state.throttles[finding.uid] = throttle
            return [self._audit(record)]
        self.actions.tell("terminate", finding, message, user_refs)
        record, pending = self.actions.terminate(finding, self.settings.kill_grace)
        self.state.pending_kills.extend(pending)
        return [self._audit(record)]

    def finish_kills(self, now: float) -> list[ActionRecord]:
        """SIGKILL what outlived SIGTERM's grace; pending kills survive restarts too."""
        due = [k for k in self.state.pending_kills if k.deadline <= now]
        self.state.pending_kills = [k for k in self.state.pending_kills if k.deadline > now]
        records = []
        for pending in due:
            record = self.actions.kill(pending)
            if record is not None:
                records.append(self._audit(record))
        return records

    def _forgive(self, now: float, active: set[str], unknown: set[str]) -> list[ActionRecord]:
        for key, violation in list(self.state.violations.items()):
            if key in active or violation.kind in unknown:
                continue  # a rule that could not be judged this time is not forgiven
            if violation.stage == 0:  # not sustained through its window: start again
                del self.state.violations[key]
                self.log.debug("login_guard.cleared", user=violation.user,
                               uid=violation.uid, rule=violation.rule, steps=0,
                               dry_run=self.dry_run)
            elif now - violation.last_seen >= self.settings.forgive_after:
                del self.state.violations[key]
                self.log.info("login_guard.cleared", user=violation.user, uid=violation.uid,
                              rule=violation.rule, since=violation.since,
                              last_seen=violation.last_seen, steps=violation.stage,
                              dry_run=self.dry_run)
        records = []
        offending = {v.uid for v in self.state.violations.values()}
        for uid, throttle in list(self.state.throttles.items()):
            if uid not in offending:
                records.append(self._audit(self.actions.unthrottle(
                    throttle, f"no violation seen for {self.settings.forgive_after:g} s")))
                del self.state.throttles[uid]
        return records

    def _audit(self, record: ActionRecord) -> ActionRecord:
        self.state.record(record)
        self.log.info("login_guard.action", **dataclasses.asdict(record))
        return record

    def message(self, finding: Finding, violation: Violation, step: str, following: str,
                now: float) -> str:
        """What the user reads: the rule, what was seen, what happens, where to go instead."""
        since = time.strftime("%H:%M:%S", time.localtime(violation.since))
        lines = [
            f"jobwrap login guard: {finding.user}, this login node's rule on "
            f"{TITLES[finding.kind]} ({finding.rule}) is broken.",
            f"Seen: {finding.seen}.",
            f"Going on since {since} ({_duration(now - violation.since)}).",
        ]
        pids = ", ".join(str(t.pid) for t in finding.targets) or "none"
        if step == "warn":
            lines.append("This is a warning.")
        elif step == "throttle":
            lines.append(f"Your processes are now throttled (less CPU): {pids}.")
        else:
            lines.append(f"Your processes {pids} are being terminated (SIGTERM, then "
                         f"SIGKILL after {self.settings.kill_grace:g} s).")
        if following:
            lines.append(f"If it goes on for {_duration(self.settings.escalate_after)} more, "
                         f"they will be {_PAST[following]}.")
        lines.append("Login nodes are for editing, building and submitting. "
                     + self.settings.advice)
        return "\n".join(lines)

    def close(self) -> None:
        self.scanner.close()

    # -- the loop -----------------------------------------------------------------------

    def request_stop(self, signum: int = 0, frame: Any = None) -> None:
        """A signal handler as a plain method: the loop ends after the current step."""
        self._stop.set()

    def run_once(self) -> CycleReport:
        """One judged scan (after a short CPU sample), then every kill it started, done."""
        self.scanner.scan()
        self._stop.wait(ONCE_SAMPLE_SECONDS)
        report = self.cycle()
        extra = list(report.actions)
        while self.state.pending_kills and not self._stop.is_set():
            wait = min(k.deadline for k in self.state.pending_kills) - self.clock()
            if wait > 0:
                self._stop.wait(wait)
            extra.extend(self.finish_kills(self.clock()))
            self.save()
        return dataclasses.replace(report, actions=tuple(extra))

    def run_forever(self) -> None:
        interval = self.settings.interval
        self.log.info("login_guard.started", interval=interval, dry_run=self.dry_run,
                      pid=os.getpid(), state=str(self.store.path),
                      violations=len(self.state.violations))
        next_scan = time.monotonic()
        while not self._stop.is_set():
            if time.monotonic() >= next_scan:
                self.cycle()
                next_scan = max(next_scan + interval, time.monotonic())
            elif self.state.pending_kills and self.finish_kills(self.clock()):
                self.save()
            wait = next_scan - time.monotonic()
            if self.state.pending_kills:
                wait = min(wait, min(k.deadline for k in self.state.pending_kills)
                           - self.clock())
            self._stop.wait(max(wait, 0.05))
        self.log.info("login_guard.stopped", pid=os.getpid())


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"
