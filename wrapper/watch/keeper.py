"""The first node's watcher keeps the attempt's supervisor alive.

The supervisor runs with the job user's rights (hang detection, checkpoint tracking, the
walltime signal); the user can kill it, and so can the OOM killer or a bug. Without it the
attempt runs unsupervised: a hang is only ended by the time limit. The root watcher of the
node the prolog started it on looks at it on each tick and, while the attempt runs and the
supervisor did not end by itself (its ``supervisor.end``), starts it again the way the
prolog did, at most ``limit`` times per attempt (a user who kills it in a loop gets an
unsupervised job, not a fork bomb), and records root's ``supervisor.restarted``.

The supervisor is found by the pid root recorded (``supervisor.started`` or
``supervisor.restarted``: ``detached:PID``), checked by its command line and start time,
never by name; under systemd (``how == "systemd"``) the unit's own restart policy applies
and nothing is done here.
"""

from __future__ import annotations

from collections.abc import Callable

from wrapper import log
from wrapper.job import events as ev
from wrapper.job.state import JobState
from wrapper.job.store import JobStore

RESTARTS_PER_ATTEMPT = 3


class SupervisorKeeper:
    def __init__(self, state: JobState, *, job_id: str, node: str, attempt: int,
                 restart: Callable[[], str], limit: int = RESTARTS_PER_ATTEMPT) -> None:
        self.store, self.job_id, self.node, self.attempt = JobStore(state), job_id, node, attempt
        self.restart, self.limit = restart, limit
        self.done = False  # nothing more to keep: ended, systemd's, or the limit reached
        self._running: tuple[int, float] | None = None  # (pid, since) last seen alive

    def __call__(self) -> None:
        if self.done or (self._running is not None and self._alive(*self._running)):
            return  # the events are read only once the supervisor seen last is gone
        self._running = None
        events = self.store.events()
        started = [e for e in events if e.from_root
                   and isinstance(e, (ev.SupervisorStarted, ev.SupervisorRestarted))
                   and e.attempt == self.attempt and e.node == self.node]
        if not started:
            return  # not this node's (or the prolog did not start one)
        last = started[-1]
        if not last.how.startswith("detached:"):
            self.done = True  # systemd's unit, or nothing started
            return
        try:
            pid = int(last.how.split(":", 1)[1])
        except ValueError:
            self.done = True
            return
        if self._alive(pid, last.ts):
            self._running = (pid, last.ts)
            return
        if self._over(events, last.ts):
            self.done = True
            return
        restarts = len(started) - 1
        if restarts >= self.limit:
            log.get().error("watch.supervisor_gone", restarts=restarts,
                            why="the restart limit is reached; the attempt runs unsupervised")
            self.done = True
            return
        how = self.restart()
        self.store.record(ev.SupervisorRestarted(attempt=self.attempt, node=self.node,
                                                 how=how, restarts=restarts + 1))
        log.get().warning("watch.supervisor_restarted", how=how, restarts=restarts + 1)

    def _alive(self, pid: int, since: float) -> bool:
        import psutil

        try:
            proc = psutil.Process(pid)
            cmdline = proc.cmdline()
            return proc.status() != psutil.STATUS_ZOMBIE and "supervise" in cmdline \
                and self.job_id in cmdline and proc.create_time() >= since - 5.0
        except psutil.Error:
            return False

    def _over(self, events: list[ev.Event], since: float) -> bool:
        """The attempt ended or a later one started, or the supervisor said it was done."""
        for e in events:
            if e.from_root and ((isinstance(e, ev.EpilogContext) and e.attempt >= self.attempt)
                                or (isinstance(e, ev.PrologContext) and e.attempt > self.attempt)):
                return True
            if isinstance(e, ev.SupervisorEnd) and e.attempt == self.attempt and e.ts >= since:
                return True
        return False
