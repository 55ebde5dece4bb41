"""The story of a job's attempts, told from its events: ``jobwrap status JOBID``.

``summarize(events)`` turns the job's typed events (``wrapper.job.events``, as
``JobStore.attempt_events`` or the manifest's merge decodes them) into one
``AttemptSummary`` per attempt, in order: its nodes, when it started and ended (or that
it still runs), the nodes' health verdicts, the checkpoints the supervisor saw (count,
latest step), what went wrong (a hang, a GPU fault, the walltime signal), how the
epilog classified its end and what it decided (requeue, stop, done). The manifest's
attempts are built from the same summaries, so the status of a running job and the
archive of a finished one tell the same story. Events that decide the story
(``attempt.end``, the hooks' contexts, health checks) count only when root wrote them;
the user's own events (the supervisor runs as the job user) only add checkpoints and
incidents.

Health verdicts come from the hooks' ``health`` events (phase, verdict, failures,
warnings; ``wrapper.hooks.health``) and ``health.unavailable`` (the checks could not run).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable
from dataclasses import asdict, field, fields
from typing import TYPE_CHECKING, Any

from wrapper.fastdataclass import dataclass
from wrapper.job import events as ev

if TYPE_CHECKING:
    from wrapper.job.store import JobStore

RUNNING = "running"  # no sign of its end yet
ENDING = "ending"    # an epilog has started, the verdict is not written yet
ENDED = "ended"

MAX_IN_PLACE = 100  # jobwrap run's restarts kept per attempt (its word: bounded)
MAX_NODES_SCORED = 4096  # nodes' speed scores kept per attempt
_INCIDENTS = (ev.Hang, ev.GpuFault, ev.WalltimeSignal, ev.DirectivesInvalid,
              ev.PrologUnhealthy, ev.CheckpointSuspect, ev.ResumeChosen, ev.HangForensics,
              ev.PulseLost, ev.PulseDown, ev.PulseFenced, ev.PulseHang, ev.PulseSlow)
# what only root's hooks record
_ROOT_ONLY = (ev.DirectivesInvalid, ev.PrologUnhealthy, ev.CheckpointSuspect,
              ev.ResumeChosen, ev.HangForensics, ev.PulseLost, ev.PulseDown, ev.PulseFenced,
              ev.PulseHang, ev.PulseSlow, ev.PulseSpeed)


@dataclass
class AttemptSummary:
    attempt: int
    status: str = RUNNING
    nodes: list[str] = field(default_factory=list)
    started_at: float | None = None
    ended_at: float | None = None
    health: list[dict[str, Any]] = field(default_factory=list)  # node, phase, verdict, detail
    checkpoints: int = 0
    latest_step: int | None = None
    latest_checkpoint: str | None = None
    checkpoint_list: list[dict[str, Any]] = field(default_factory=list)  # path, step, ts
    incidents: list[str] = field(default_factory=list)
    outcome: str | None = None  # the failure class (wrapper.restart.classify), "success" included
    detail: str | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    slurm_state: str | None = None
    decision: str | None = None  # requeue | stop | done
    reason: str | None = None
    excluded: list[str] = field(default_factory=list)
    spares_held: int = 0  # nodes held in reserve under jobwrap run (its run.started)
    spares_used: int = 0
    # jobwrap run's restarts inside the attempt (its run.restarted, the user's word: the
    # ledger's boundaries, a report only): {"ts": relaunched, "ended_at", "kind"}
    in_place: list[dict[str, Any]] = field(default_factory=list)
    # every node's speed score at the attempt's end (root's pulse.speed; 1.0 = as fast as
    # the job's typical rank) and the nodes the pulse named slow
    speed: dict[str, float] = field(default_factory=dict)
    slow: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttemptSummary:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def timeline(store: JobStore) -> list[AttemptSummary]:
    """The attempts of the job whose store this is, in order."""
    return summarize(store.attempt_events())


def summarize(events: Iterable[ev.Event]) -> list[AttemptSummary]:
    """One summary per attempt root recorded in ``events`` (any order; sorted by time
    here), decoded by ``ev.decode_attempts`` (a line that names no attempt belongs to
    none). Attempt numbers come from root's events alone: the user's events annotate an
    attempt root knows (checkpoints, incidents) and never create one, so a user's file
    cannot fill the ledger, the AdminComment or the report with attempts."""
    ordered_events = sorted(events, key=event_order)
    known = {e.attempt for e in ordered_events if e.from_root}
    attempts: dict[int, AttemptSummary] = {}
    prolog_starts: dict[int, float] = {}
    resumed: dict[int, ev.ResumeChosen] = {}  # root's pick, by the attempt it starts
    for event in ordered_events:
        number = event.attempt
        if number not in known:
            continue
        summary = attempts.setdefault(number, AttemptSummary(number))
        _apply(summary, event)
        ts = _when(event)
        if isinstance(event, ev.PrologContext) and event.from_root and ts is not None:
            prolog_starts[number] = min(ts, prolog_starts.get(number, ts))
        if isinstance(event, ev.ResumeChosen) and event.from_root:
            resumed[number] = event
    for number, started in prolog_starts.items():
        attempts[number].started_at = started  # root's record, never a user's earlier claim
    ordered = [attempts[n] for n in sorted(attempts)]
    for summary, later in itertools.pairwise(ordered):
        if summary.status != ENDED:
            summary.status = ENDED  # a later attempt exists: this one is over
            summary.ended_at = summary.ended_at or later.started_at
        if later.attempt in resumed:
            _add_resumed_from(summary, resumed[later.attempt])
    return ordered


def _add_resumed_from(summary: AttemptSummary, chosen: ev.ResumeChosen) -> None:
    """The checkpoint root found for the next attempt, written during this one, joins this
    attempt's checkpoints when the supervisor's events do not have it (the supervisor was
    killed, or the job wrote it after its last look): the ledger's kept work then ends at
    it, not at the last checkpoint a user-side process happened to report."""
    mtime, path, step = _time(chosen.mtime), chosen.path, chosen.step
    start = summary.started_at
    if mtime is None or not path or start is None or mtime < start or (
            summary.ended_at is not None and mtime > summary.ended_at):
        return
    seen = [c for c in summary.checkpoint_list if isinstance(c.get("ts"), (int, float))]
    if any(c.get("path") == path for c in seen) or any(c["ts"] >= mtime for c in seen):
        return
    summary.checkpoint_list.append({"path": path, "step": step, "ts": mtime, "by": "root"})
    summary.latest_checkpoint, summary.latest_step = path, step


def event_order(event: ev.Event) -> float:
    """An event's time for sorting: a ``ts`` the user's file made up ("soon", NaN,
    1e999) sorts first instead of raising (the archive is built from this)."""
    ts = _when(event)
    return 0.0 if ts is None else ts


def _when(event: ev.Event) -> float | None:
    return _time(event.ts)


def _time(value: float) -> float | None:
    """A decoded time, or None for none: decode's 0.0 (absent, or not a number) and a
    made-up NaN or 1e999."""
    return value if value and math.isfinite(value) else None


def _apply(summary: AttemptSummary, event: ev.Event) -> None:
    by_root = event.from_root
    ts = _when(event)
    if by_root and isinstance(event, (ev.PrologContext, ev.EpilogContext)):
        for member in [*(event.context.get("nodes") or []), event.node]:
            if member and member not in summary.nodes:
                summary.nodes.append(str(member))
        if isinstance(event, ev.PrologContext):
            if summary.started_at is None or (ts is not None and ts < summary.started_at):
                summary.started_at = ts
        elif summary.status == RUNNING:
            summary.status = ENDING
    elif by_root and isinstance(event, ev.AttemptEnd):
        summary.status, summary.ended_at = ENDED, ts
        summary.outcome, summary.detail = event.kind, event.detail
        summary.exit_code, summary.exit_signal = event.exit_code, event.exit_signal
        summary.slurm_state = event.slurm_state
        summary.decision, summary.reason = event.decision, event.reason
        summary.excluded = [str(n) for n in event.exclude]
        if event.checkpoint_path and summary.latest_checkpoint is None:
            summary.latest_checkpoint = event.checkpoint_path
            summary.latest_step = event.checkpoint_step
    elif by_root and isinstance(event, ev.Health):
        said = event.failures or event.warnings
        summary.health.append({"node": event.node, "phase": event.phase,
                               "verdict": event.verdict or "?",
                               "detail": "; ".join(str(s) for s in said)})
    elif by_root and isinstance(event, ev.HealthUnavailable):
        summary.health.append({"node": event.node, "phase": "", "verdict": "unchecked",
                               "detail": event.error})
    elif isinstance(event, ev.Checkpoint):
        path, step = event.path or None, event.step
        summary.checkpoints += 1
        entry = {"path": path, "step": step, "ts": ts}
        if event.save_s is not None:  # how long saving it took, when measured
            entry["save_s"] = event.save_s
        summary.checkpoint_list.append(entry)
        summary.latest_checkpoint, summary.latest_step = path, step
    elif isinstance(event, ev.ResumeChosen) and not event.passed_over:
        pass  # an ordinary resume: the banner in the job's output says it
    elif isinstance(event, ev.RunStarted):
        summary.spares_held = max(summary.spares_held, event.spare_nodes)
    elif isinstance(event, ev.RunRestarted) and ts is not None and \
            ts <= time.time() and len(summary.in_place) < MAX_IN_PLACE:
        from wrapper.job.kinds import PREEMPTED, RETRYABLE, UNCHECKED

        # what jobwrap run restarts on (never a preemption or a skipped prolog)
        restarts_on = RETRYABLE - {PREEMPTED, UNCHECKED}
        kind = event.kind_ended if event.kind_ended in restarts_on else "unknown"
        summary.in_place.append({"ts": ts, "ended_at": _time(event.ended_at) or ts,
                                 "kind": kind})
    elif isinstance(event, ev.PulseSpeed):
        if by_root:
            summary.speed = dict(list(event.scores.items())[:MAX_NODES_SCORED])
            summary.slow = [n for n in event.named if n in summary.speed]
    elif isinstance(event, ev.SpareUsed):
        summary.spares_used += len(event.failed)
        summary.incidents.append(
            f"moved onto spare {','.join(str(n) for n in event.replaced_by)}: "
            f"{event.reason}; {event.spares_left} spare left")
    elif isinstance(event, _INCIDENTS) and (by_root or not isinstance(event, _ROOT_ONLY)):
        summary.incidents.append(_incident(event))
    if summary.started_at is None and ts is not None and by_root:
        summary.started_at = ts  # no prolog record (it failed, or its node's state is elsewhere)


def _incident(event: ev.Event) -> str:
    if isinstance(event, ev.Hang):
        return f"hang: no progress for {event.idle_s} s"
    if isinstance(event, ev.HangForensics):
        odd = "; ".join(str(o) for o in event.odd)
        return f"hang forensics: {'standing apart: ' + odd if odd else ''}" \
               f"{' (' if odd else ''}{event.why}{')' if odd else ''}" + \
               "".join(f"; flight recorder: {f}" for f in event.flight)
    if isinstance(event, ev.GpuFault):
        return f"GPU fault: {event.reason}"
    if isinstance(event, ev.WalltimeSignal):
        return f"walltime: sent {event.signal or 'a signal'} before the time limit"
    if isinstance(event, ev.CheckpointSuspect):
        return f"checkpoint {event.path} is suspect ({event.reason}); " \
               f"next attempt falls back to {event.fallback or 'an older one'}"
    if isinstance(event, ev.ResumeChosen):
        return f"resumed from {event.path}, falling back past the suspect " \
               f"{', '.join(str(p) for p in event.passed_over)}"
    if isinstance(event, ev.PrologUnhealthy):
        return f"{event.node or 'a node'} failed its prolog health check: " \
               f"{event.reason or ''}"
    if isinstance(event, ev.PulseLost):
        return f"{event.lost} lost: no heartbeat for {event.silent_s:g} s"
    if isinstance(event, ev.PulseDown):
        return f"{event.lost} " + (f"left up: {event.error}" if event.error
                                   else "set DOWN in Slurm")
    if isinstance(event, ev.PulseHang):
        return f"hang: stuck {event.held_s:g} s ({event.why}); " + \
            ("; ".join(event.stuck) or "no rank stands apart") + \
            "".join(f"; {f}" for f in event.flight)
    if isinstance(event, ev.PulseSlow):
        return f"{event.slow} named slow: its ranks at {event.score:.2f} of the job's " \
               f"typical rank's speed for {event.held_s:g} s"
    if isinstance(event, ev.PulseFenced):
        return f"{event.node or 'a node'} fenced itself ({event.why}): " \
               f"{event.killed} process(es) of the job killed"
    error = event.error if isinstance(event, ev.DirectivesInvalid) else ""
    return f"bad #JOBWRAP directives: {error}"


# -- rendering ---------------------------------------------------------------------------
def render(job_id: str, attempts: list[AttemptSummary], *, now: float | None = None) -> str:
    """The timeline as text for a terminal, one block per attempt."""
    now = time.time() if now is None else now
    if not attempts:
        return f"job {job_id}: no attempt recorded\n"
    lines = [f"job {job_id}: {len(attempts)} attempt{'s' if len(attempts) != 1 else ''}, "
             f"{job_state(attempts)}"]
    for a in attempts:
        started = _clock(a.started_at)
        if a.status == ENDED:
            span = f"{started} -> {_clock(a.ended_at)}  ({_duration(a.started_at, a.ended_at)})"
        else:
            span = f"{started} -> {a.status}  ({_duration(a.started_at, now)} so far)"
        lines.append(f"attempt {a.attempt}  {a.status:<7}  nodes {','.join(a.nodes) or '?'}  "
                     f"{span}")
        if a.health:
            lines.append("  health       " + ", ".join(
                " ".join(p for p in (h["node"], h["phase"], h["verdict"]) if p)
                + (f" ({h['detail']})" if h.get("detail") else "") for h in a.health))
        if a.checkpoints or a.latest_checkpoint:
            step = "unknown" if a.latest_step is None else a.latest_step
            lines.append(f"  checkpoints  {a.checkpoints} (latest step {step})")
        for incident in a.incidents:
            lines.append(f"  incident     {incident}")
        if a.speed:
            shown = sorted(a.speed.items(), key=lambda p: (p[1], p[0]))
            lines.append("  speed        " + ", ".join(
                f"{n} {v:.2f}" + (" SLOW" if n in a.slow else "") for n, v in shown[:8])
                + (f" (and {len(shown) - 8} more at or above {shown[8][1]:.2f})"
                   if len(shown) > 8 else "") + "  (1.00 = as fast as the typical rank)")
        if a.spares_held:
            end = a.ended_at if a.status == ENDED and a.ended_at else now
            hours = a.spares_held * max(0.0, end - (a.started_at or end)) / 3600
            lines.append(f"  spares       {a.spares_held} held ({hours:.2f} node-h in reserve); "
                         f"used {a.spares_used}, each a requeue avoided")
        if a.outcome:
            exit_text = "" if a.exit_code is None else f"; exit {a.exit_code}" + (
                f", signal {a.exit_signal}" if a.exit_signal else "")
            state = f"; Slurm {a.slurm_state}" if a.slurm_state else ""
            lines.append(f"  outcome      {a.outcome}: {a.detail or ''}{exit_text}{state}")
        if a.decision:
            excluded = f" (excluded {', '.join(a.excluded)})" if a.excluded else ""
            lines.append(f"  decision     {a.decision}: {a.reason or ''}{excluded}")
    return "\n".join(lines) + "\n"


def job_state(attempts: list[AttemptSummary]) -> str:
    """One phrase for where the whole job stands."""
    last = attempts[-1]
    if last.status != ENDED:
        return f"attempt {last.attempt} {last.status}"
    if last.decision == "requeue":
        return f"requeued after attempt {last.attempt}"
    if last.decision:
        return f"finished: {last.outcome or 'unknown'} ({last.decision})"
    return f"ended: {last.outcome or 'no verdict recorded'}"


def _clock(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts is not None else "?"


def _duration(start: float | None, end: float | None) -> str:
    if start is None or end is None:
        return "?"
    seconds = max(0, int(end - start))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"

