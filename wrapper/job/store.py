"""The job's event store and the queries every stage asks of it.

``JobStore`` wraps the file layer (``wrapper.job.state.JobState``: safe appends, bounded
reads) with typed events: writers ``record`` an event object, readers get decoded
events and ask the questions by name. Control flow reads root's events only; the user's
(``source == "user"``) are claims.

The attempt number: the hooks take it from Slurm (``SLURM_RESTART_COUNT`` in
``JobContext.attempt``); everything that runs outside a hook (the supervisor, status)
asks ``current_attempt``, the highest attempt a root prolog recorded, which is the same
number.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from wrapper.fastdataclass import dataclass
from wrapper.job import events as ev
from wrapper.job.paths import BATCH_SCRIPT, JobPaths

if TYPE_CHECKING:
    from wrapper.config import Config
    from wrapper.job.state import JobState

SCRIPT_MAX = 4 << 20  # bytes of a kept batch script ever read back (Slurm's own cap)


@dataclass(frozen=True)
class JobStore:
    state: JobState

    @classmethod
    def of(cls, cfg: Config, job_id: str) -> JobStore:
        from wrapper.job.state import for_job

        return cls(for_job(cfg, job_id))

    @property
    def paths(self) -> JobPaths:
        return JobPaths(self.state.state_dir, self.state.job_id)

    # -- writing ----------------------------------------------------------------------------
    def record(self, event: ev.Event) -> dict[str, Any]:
        """Append ``event`` to its writer's file (root's, or the user's as the user)."""
        return self.state.append(event.KIND, as_user=event.WRITER == "user", **event.encode())

    def save_script(self, text: str) -> None:
        """Keep the attempt's batch script (fetched from Slurm once, by the prolog)."""
        self.state.write_bytes(BATCH_SCRIPT, text.encode("utf-8", "surrogateescape"))

    # -- reading ----------------------------------------------------------------------------
    def events(self) -> list[ev.Event]:
        """Every event, root's and the user's, decoded, in time order."""
        return [ev.decode(record) for record in self.state.events()]

    def root_events(self) -> list[ev.Event]:
        return [ev.decode(record) for record in self.state.events(root_only=True)]

    def attempt_events(self) -> list[ev.Event]:
        """Every event that names its attempt, decoded (``ev.decode_attempts``): what the
        story of the attempts (``wrapper.archive.status``) is told from."""
        return ev.decode_attempts(self.state.events())

    def script(self) -> str | None:
        """The kept batch script, or None when the prolog kept none."""
        raw = self.state.read_bytes(BATCH_SCRIPT, SCRIPT_MAX)
        return None if raw is None else raw.decode("utf-8", "replace")

    # -- the queries ------------------------------------------------------------------------
    def current_attempt(self, events: Iterable[ev.Event] | None = None) -> int:
        """The attempt running now: the highest one a root prolog recorded (0 before any)."""
        attempts = [e.attempt for e in self._root(events) if isinstance(e, ev.PrologContext)]
        return max(attempts, default=0)

    def superseded(self, attempt: int) -> bool:
        """A later attempt than ``attempt`` has started (Slurm requeued the job)."""
        return self.current_attempt() > attempt

    def staging_refusal(self, node: str, attempt: int,
                        events: Iterable[ev.Event] | None = None) -> str:
        """Why this node's prolog could not prepare ``attempt``: its data or its directives
        ("" when it could). Root's events only."""
        for event in self._root(events):
            if event.node != node or event.attempt != attempt:
                continue
            if (isinstance(event, ev.StagingFailed) and event.direction == "in") or \
                    isinstance(event, ev.DirectivesInvalid):
                return " ".join(event.error.split())
        return ""

    def prolog_ran(self, node: str, attempt: int,
                   events: Iterable[ev.Event] | None = None) -> bool:
        """Root's prolog recorded ``attempt`` on ``node`` (its first act, so a prolog that
        ran at all did). Root's events only: the user cannot vouch for a check."""
        return any(isinstance(e, ev.PrologContext) and e.node == node and e.attempt == attempt
                   for e in self._root(events))

    def history(self, before: int, events: Iterable[ev.Event] | None = None
                ) -> list[ev.AttemptEnd]:
        """Root's verdicts on the attempts other than ``before``, oldest first."""
        return [e for e in self._root(events)
                if isinstance(e, ev.AttemptEnd) and e.attempt != before]

    def last_end(self, events: Iterable[ev.Event] | None = None
                 ) -> ev.AttemptEnd | ev.PrologUnhealthy | None:
        """How the previous attempt ended: root's verdict, or a prolog's failed check."""
        ends = [e for e in self._root(events)
                if isinstance(e, (ev.AttemptEnd, ev.PrologUnhealthy))]
        return ends[-1] if ends else None

    def resumed_from(self, attempt: int, events: Iterable[ev.Event] | None = None
                     ) -> ev.ResumeChosen | None:
        """The checkpoint root chose for ``attempt`` to resume from (None: none chosen)."""
        chosen = [e for e in self._root(events)
                  if isinstance(e, ev.ResumeChosen) and e.attempt == attempt and e.path]
        return chosen[-1] if chosen else None

    def suspects(self, events: Iterable[ev.Event] | None = None) -> list[ev.CheckpointSuspect]:
        """The checkpoints root judged suspect, oldest verdict first."""
        return [e for e in self._root(events)
                if isinstance(e, ev.CheckpointSuspect) and e.path]

    def prolog_failed_here(self, node: str) -> bool:
        """This node's last prolog event is its failed health check (the job never ran)."""
        mine = [e for e in self.root_events() if e.node == node
                and e.KIND.startswith("prolog.")]
        return bool(mine) and isinstance(mine[-1], ev.PrologUnhealthy)

    def user_claims(self, attempt: int) -> list[ev.Event]:
        """What the user's side wrote for ``attempt``: reports to re-verify, never facts."""
        return [e for e in (ev.decode(r) for r in self.state.events(user_only=True))
                if not e.from_root and e.attempt == attempt]

    def under_run(self, attempt: int) -> bool:
        """Whether the job's command runs under ``jobwrap run`` in ``attempt``: its
        ``run.started``, the user's word (a job that lies about it decides only how its
        own steps are ended)."""
        return any(isinstance(e, ev.RunStarted) for e in self.user_claims(attempt))

    def run_restarts(self, attempt: int) -> int:
        """How many times ``jobwrap run`` started its command again in ``attempt`` (its
        ``run.restarted``: the user's word)."""
        return sum(1 for e in self.user_claims(attempt) if isinstance(e, ev.RunRestarted))

    def _root(self, events: Iterable[ev.Event] | None) -> list[ev.Event]:
        if events is None:
            return self.root_events()
        return [e for e in events if e.from_root]
