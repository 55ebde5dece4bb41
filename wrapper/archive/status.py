"""The story of a job's attempts, told from its events: ``jobwrap status JOBID``.

``summarize(events)`` turns the job's event records into one ``AttemptSummary`` per
attempt, in order: its nodes, when it started and ended (or that it still runs), the
nodes' health verdicts, the checkpoints the supervisor saw (count, latest step), what
went wrong (a hang, a GPU fault, the walltime signal), how the epilog classified its
end and what it decided (requeue, stop, done). The manifest's attempts are built from
the same summaries, so the status of a running job and the archive of a finished one
tell the same story. Events that decide the story (``attempt.end``, the hooks'
contexts, health checks) count only when root wrote them; the user's own events
(the supervisor runs as the job user) only add checkpoints and incidents.

Health verdicts come from the hooks' ``health`` events (phase, verdict, failures,
warnings; ``wrapper.hooks.health``) and ``health.unavailable`` (the checks could not run).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable
from dataclasses import asdict, field, fields
from typing import Any

from wrapper.job import events as ev
from wrapper.job.state import JobState
from wrapper.lean import dataclass

RUNNING = "running"  # no sign of its end yet
ENDING = "ending"    # an epilog has started, the verdict is not written yet
ENDED = "ended"

_INCIDENTS = {ev.Hang.KIND, ev.GpuFault.KIND, ev.WalltimeSignal.KIND,
              ev.DirectivesInvalid.KIND, ev.PrologUnhealthy.KIND, ev.CheckpointSuspect.KIND,
              ev.ResumeChosen.KIND, ev.HangForensics.KIND}
# what only root's hooks record
_ROOT_ONLY = {ev.DirectivesInvalid.KIND, ev.PrologUnhealthy.KIND, ev.CheckpointSuspect.KIND,
              ev.ResumeChosen.KIND, ev.HangForensics.KIND}


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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttemptSummary:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def timeline(state: JobState) -> list[AttemptSummary]:
    """The attempts of the job whose state this is, in order."""
    return summarize(state.events())


def summarize(events: Iterable[dict[str, Any]]) -> list[AttemptSummary]:
    """One summary per attempt root recorded in ``events`` (any order; sorted by time
    here). Attempt numbers come from root's events alone: the user's events annotate an
    attempt root knows (checkpoints, incidents) and never create one, so a user's file
    cannot fill the ledger, the AdminComment or the report with attempts."""
    ordered_events = sorted(events, key=event_order)
    known = {n for n in (_attempt_of(e) for e in ordered_events
                         if e.get("source", "root") == "root") if n is not None}
    attempts: dict[int, AttemptSummary] = {}
    prolog_starts: dict[int, float] = {}
    resumed: dict[int, dict[str, Any]] = {}  # root's resume.chosen, by the attempt it starts
    for event in ordered_events:
        number = _attempt_of(event)
        if number is None or number not in known:
            continue
        summary = attempts.setdefault(number, AttemptSummary(number))
        _apply(summary, event)
        ts = _finite(event.get("ts"))
        by_root = event.get("source", "root") == "root"
        if event.get("event") == ev.PrologContext.KIND and by_root and ts is not None:
            prolog_starts[number] = min(ts, prolog_starts.get(number, ts))
        if event.get("event") == ev.ResumeChosen.KIND and by_root:
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


def _add_resumed_from(summary: AttemptSummary, chosen: dict[str, Any]) -> None:
    """The checkpoint root found for the next attempt, written during this one, joins this
    attempt's checkpoints when the supervisor's events do not have it (the supervisor was
    killed, or the job wrote it after its last look): the ledger's kept work then ends at
    it, not at the last checkpoint a user-side process happened to report."""
    mtime, path, step = _finite(chosen.get("mtime")), _str(chosen.get("path")), \
        _int(chosen.get("step"))
    start = summary.started_at
    if mtime is None or not path or start is None or mtime < start or (
            summary.ended_at is not None and mtime > summary.ended_at):
        return
    seen = [c for c in summary.checkpoint_list if isinstance(c.get("ts"), (int, float))]
    if any(c.get("path") == path for c in seen) or any(c["ts"] >= mtime for c in seen):
        return
    summary.checkpoint_list.append({"path": path, "step": step, "ts": mtime, "by": "root"})
    summary.latest_checkpoint, summary.latest_step = path, step


def event_order(event: dict[str, Any]) -> float:
    """An event's time for sorting: a ``ts`` the user's file made up ("soon", NaN,
    1e999) sorts first instead of raising (the archive is built from this)."""
    ts = _finite(event.get("ts"))
    return 0.0 if ts is None else ts


def _finite(value: Any) -> float | None:
    ts = _float(value)
    return ts if ts is not None and math.isfinite(ts) else None


def _attempt_of(event: dict[str, Any]) -> int | None:
    value = event.get("attempt")
    if value is None and isinstance(event.get("context"), dict):
        value = event["context"].get("attempt")
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _apply(summary: AttemptSummary, event: dict[str, Any]) -> None:
    name = str(event.get("event", ""))
    by_root = event.get("source", "root") == "root"
    ts = _finite(event.get("ts"))
    node = str(event.get("node") or "")
    if by_root and name in (ev.PrologContext.KIND, ev.EpilogContext.KIND):
        raw = event.get("context")
        context: dict[str, Any] = raw if isinstance(raw, dict) else {}
        for member in [*(context.get("nodes") or []), node]:
            if member and member not in summary.nodes:
                summary.nodes.append(str(member))
        if name == ev.PrologContext.KIND:
            if summary.started_at is None or (ts is not None and ts < summary.started_at):
                summary.started_at = ts
        elif summary.status == RUNNING:
            summary.status = ENDING
    elif by_root and name == ev.AttemptEnd.KIND:
        summary.status, summary.ended_at = ENDED, ts
        summary.outcome, summary.detail = _str(event.get("kind")), _str(event.get("detail"))
        summary.exit_code, summary.exit_signal = _int(event.get("exit_code")), \
            _int(event.get("exit_signal"))
        summary.slurm_state = _str(event.get("slurm_state"))
        summary.decision, summary.reason = _str(event.get("decision")), \
            _str(event.get("reason"))
        summary.excluded = [str(n) for n in event.get("exclude") or []]
        step = _int(event.get("checkpoint_step"))
        if event.get("checkpoint_path") and summary.latest_checkpoint is None:
            summary.latest_checkpoint, summary.latest_step = str(event["checkpoint_path"]), step
    elif by_root and name == ev.Health.KIND:
        said = event.get("failures") or event.get("warnings") or []
        summary.health.append({"node": node, "phase": str(event.get("phase") or ""),
                               "verdict": str(event.get("verdict") or "?"),
                               "detail": "; ".join(str(s) for s in said)})
    elif by_root and name == ev.HealthUnavailable.KIND:
        summary.health.append({"node": node, "phase": "", "verdict": "unchecked",
                               "detail": str(event.get("error") or "")})
    elif name == ev.Checkpoint.KIND:
        path, step = _str(event.get("path")), _int(event.get("step"))
        summary.checkpoints += 1
        entry = {"path": path, "step": step, "ts": ts}
        if _float(event.get("save_s")) is not None:  # how long saving it took, when measured
            entry["save_s"] = _float(event.get("save_s"))
        summary.checkpoint_list.append(entry)
        summary.latest_checkpoint, summary.latest_step = path, step
    elif name == ev.ResumeChosen.KIND and not event.get("passed_over"):
        pass  # an ordinary resume: the banner in the job's output says it
    elif name == ev.RunStarted.KIND:
        summary.spares_held = max(summary.spares_held, _int(event.get("spare_nodes")) or 0)
    elif name == ev.SpareUsed.KIND:
        summary.spares_used += len(event.get("failed") or [])
        summary.incidents.append(
            f"moved onto spare {','.join(str(n) for n in event.get('replaced_by') or [])}: "
            f"{event.get('reason', '')}; {event.get('spares_left', '?')} spare left")
    elif name in _INCIDENTS and (by_root or name not in _ROOT_ONLY):
        summary.incidents.append(_incident(name, event))
    if summary.started_at is None and ts is not None and by_root:
        summary.started_at = ts  # no prolog record (it failed, or its node's state is elsewhere)


def _incident(name: str, event: dict[str, Any]) -> str:
    if name == ev.Hang.KIND:
        return f"hang: no progress for {event.get('idle_s')} s"
    if name == ev.HangForensics.KIND:
        odd = "; ".join(str(o) for o in event.get("odd") or [])
        return f"hang forensics: {'standing apart: ' + odd if odd else ''}" \
               f"{' (' if odd else ''}{event.get('why', '')}{')' if odd else ''}"
    if name == ev.GpuFault.KIND:
        return f"GPU fault: {event.get('reason', '')}"
    if name == ev.WalltimeSignal.KIND:
        return f"walltime: sent {event.get('signal', 'a signal')} before the time limit"
    if name == ev.CheckpointSuspect.KIND:
        return f"checkpoint {event.get('path')} is suspect ({event.get('reason', '')}); " \
               f"next attempt falls back to {event.get('fallback') or 'an older one'}"
    if name == ev.ResumeChosen.KIND:
        return f"resumed from {event.get('path')}, falling back past the suspect " \
               f"{', '.join(str(p) for p in event.get('passed_over') or [])}"
    if name == ev.PrologUnhealthy.KIND:
        return f"{event.get('node', 'a node')} failed its prolog health check: " \
               f"{event.get('reason', '')}"
    return f"bad #JOBWRAP directives: {event.get('error', '')}"


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


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError, OverflowError):  # "many", NaN, 1e400 from the user's file
        return None


def _float(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
