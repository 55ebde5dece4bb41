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
from typing import Any

from wrapper import log
from wrapper.job import events as ev
from wrapper.state import JobState

RESTARTS_PER_ATTEMPT = 3


class SupervisorKeeper:
    def __init__(self, state: JobState, *, job_id: str, node: str, attempt: int,
                 restart: Callable[[], str], limit: int = RESTARTS_PER_ATTEMPT) -> None:
        self.state, self.job_id, self.node, self.attempt = state, job_id, node, attempt
        self.restart, self.limit = restart, limit
        self.done = False  # nothing more to keep: ended, systemd's, or the limit reached

    def __call__(self) -> None:
        if self.done:
            return
        events = self.state.events()
        started = [e for e in events if e.get("source") == "root"
                   and e.get("event") in (ev.SupervisorStarted.KIND, ev.SupervisorRestarted.KIND)
                   and e.get("attempt") == self.attempt and e.get("node") == self.node]
        if not started:
            return  # not this node's (or the prolog did not start one)
        last = started[-1]
        how = str(last.get("how", ""))
        if not how.startswith("detached:"):
            self.done = True  # systemd's unit, or nothing started
            return
        if self._alive(how, _seconds(last.get("ts"))) or self._over(events, last):
            return
        restarts = len(started) - 1
        if restarts >= self.limit:
            log.get().error("watch.supervisor_gone", restarts=restarts,
                            why="the restart limit is reached; the attempt runs unsupervised")
            self.done = True
            return
        how = self.restart()
        self.state.append(ev.SupervisorRestarted.KIND, attempt=self.attempt, node=self.node,
                          how=how, restarts=restarts + 1)
        log.get().warning("watch.supervisor_restarted", how=how, restarts=restarts + 1)

    def _alive(self, how: str, since: float) -> bool:
        import psutil

        try:
            proc = psutil.Process(int(how.split(":", 1)[1]))
            cmdline = proc.cmdline()
            return proc.status() != psutil.STATUS_ZOMBIE and "supervise" in cmdline \
                and self.job_id in cmdline and proc.create_time() >= since - 5.0
        except (ValueError, psutil.Error):
            return False

    def _over(self, events: list[dict[str, Any]], last: dict[str, Any]) -> bool:
        """The attempt ended or a later one started, or the supervisor said it was done."""
        since = _seconds(last.get("ts"))
        for e in events:
            name, source = e.get("event"), e.get("source")
            if source == "root" and name in (ev.EpilogContext.KIND, ev.PrologContext.KIND) \
                    and int(e.get("attempt") or 0) >= self.attempt + (
                        name == ev.PrologContext.KIND):
                self.done = True
                return True
            if name == ev.SupervisorEnd.KIND and e.get("attempt") == self.attempt \
                    and _seconds(e.get("ts")) >= since:
                self.done = True
                return True
        return False



def _seconds(value: Any) -> float:
    """An event's ``ts``; a made-up one (the user's file: "soon", NaN) reads 0."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if number == number else 0.0
