"""One job's goodput ledger, computed from its attempts: pure, no I/O.

Per attempt: its start, its first progress, its checkpoints (time, step), its end and
its class. Every second of the job's wall time (first start -> last end, or now while it
runs) falls in exactly one bucket:

- ``startup``: the first attempt's start -> its first progress;
- ``gap``: an attempt's end -> the next attempt's first progress (queue time, the next
  prolog, loading the checkpoint): the restart gap, charged to the class that ended the
  earlier attempt;
- ``productive``: first progress -> the last checkpoint before a failure (or -> the end
  of an attempt that succeeded, or -> now for the running one): work that was kept;
- ``lost``: the last checkpoint before a failure -> the failure (the work redone).

ETTR (effective training time ratio) = productive / wall, always within [0, 1].

First progress: the supervisor records checkpoints, not steps, so an attempt's first
progress is estimated from its checkpoints' steps: the step it resumed from (the
previous attempt's latest checkpoint) and the step rate seen over the job's checkpoints
give when it was back at work; without steps, its first checkpoint's time stands in,
and an attempt with no checkpoint counts from its start. Times are clamped so that
attempts never overlap and checkpoints lie within their attempt: a clock skew between
nodes moves seconds between buckets, never makes them negative.

Restarts inside the allocation (``jobwrap run``'s ``run.restarted``) cut a Slurm attempt
into parts, each an attempt here (``restart`` 1, 2, ... within its ``number``): the
work after the last checkpoint before the failure is lost and the relaunch is a gap, as
for a requeue. A part that ended so is ``in_place``: its class is jobwrap run's word (the
job's user's), which ``jobwrap report``'s failure and node counts and the AdminComment
leave out; the attempt's last part carries root's verdict.

The ONE place that reads jobwrap's event vocabulary is ``from_summaries``: it takes the
``AttemptSummary`` records that ``jobwrap status`` and the archive manifest both hold.
Checkpoint events come from the supervisor, which runs as the job's user: the ledger is
a report, never a control input.

It lives in the archive, beside the ``AttemptSummary`` it reads, because the archive's
index keeps each job's ledger in its row (``ledger_brief``); ``wrapper.goodput``, above
the archive, reads it for ``jobwrap status``, ``jobwrap report``, the advice and the
epilog's metrics.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import asdict, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from wrapper.fastdataclass import dataclass

if TYPE_CHECKING:
    from wrapper.archive.status import AttemptSummary

SUCCESS = "success"
IN_PLACE = "in_place:"  # how a restart in place's class is named in the per-class sums
RUNNING_CLASS = "running"
# The classes that are no failure: the index's failure count, ``jobwrap report``'s too.
NOT_A_FAILURE = frozenset({SUCCESS, RUNNING_CLASS, "cancelled"})


@dataclass(frozen=True)
class Checkpoint:
    ts: float
    step: int | None = None
    save_s: float | None = None  # seconds its save took, when measured
    path: str | None = None


@dataclass(frozen=True)
class Attempt:
    """What the ledger needs of one attempt. ``ended_at`` None: it still runs.
    ``kind``: the failure class (``wrapper.classify``), "success", or None (unknown)."""

    number: int
    started_at: float
    ended_at: float | None = None
    kind: str | None = None
    checkpoints: tuple[Checkpoint, ...] = ()
    nodes: tuple[str, ...] = ()
    resumed_step: int | None = None  # the checkpoint step it started from, when known
    first_progress: float | None = None  # when measured (a progress event); else estimated
    restart: int = 0  # jobwrap run's restart inside Slurm attempt ``number`` (0: its start)
    # ended by jobwrap run's restart inside the allocation: ``kind`` is jobwrap run's word
    # (the job's user's), not root's verdict
    in_place: bool = False
    slow: tuple[tuple[str, float], ...] = ()  # nodes the pulse named slow, their scores

    @property
    def fresh(self) -> bool:
        """The job's very first start: it works from step 0."""
        return self.number == 0 and self.restart == 0


@dataclass
class AttemptLedger:
    number: int
    kind: str
    nodes: list[str]
    started_at: float
    first_progress: float
    ended_at: float
    productive_s: float
    lost_s: float
    gap_before_s: float  # restart gap: the previous attempt's end -> this one's first progress
    startup_s: float
    checkpoints: int
    save_interval_s: float | None  # median seconds between its checkpoints
    restart: int = 0  # jobwrap run's restart inside Slurm attempt ``number``
    in_place: bool = False  # ended by that restart: ``kind`` is jobwrap run's word
    slow: dict[str, float] = field(default_factory=dict)  # nodes named slow: their score


@dataclass
class Ledger:
    wall_s: float = 0.0
    productive_s: float = 0.0
    lost_s: float = 0.0
    gap_s: float = 0.0
    startup_s: float = 0.0
    ettr: float = 0.0
    failures: int = 0
    attempts: list[AttemptLedger] = field(default_factory=list)
    lost_by_class: dict[str, float] = field(default_factory=dict)
    gaps_by_class: dict[str, list[float]] = field(default_factory=dict)
    checkpoint_interval_s: float | None = None  # median over the job
    save_s: float | None = None  # median measured save time of its checkpoints
    latest_checkpoint: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def account(attempts: Sequence[Attempt], *, now: float) -> Ledger:
    """The ledger of one job whose attempts these are (any order)."""
    ordered = sorted(attempts, key=lambda a: (a.number, a.restart, a.started_at))
    ledger = Ledger()
    if not ordered:
        return ledger
    own = {id(a): _own_checkpoints(a) for a in ordered}
    rate = _step_rate([own[id(a)] for a in ordered])
    previous_end: float | None = None
    previous_kind = ""
    for index, attempt in enumerate(ordered):
        last = index == len(ordered) - 1
        start = attempt.started_at if previous_end is None else max(attempt.started_at,
                                                                    previous_end)
        end = attempt.ended_at if attempt.ended_at is not None else (now if last else start)
        end = max(end, start)
        points = sorted((Checkpoint(min(max(c.ts, start), end), c.step, c.save_s, c.path)
                         for c in own[id(attempt)]), key=lambda c: c.ts)
        progress = _clamp(_first_progress(attempt, points, rate), start, end)
        kind = attempt.kind or (RUNNING_CLASS if attempt.ended_at is None and last
                                else "unknown")
        kept_until = end if kind in (SUCCESS, RUNNING_CLASS) else max(
            [c.ts for c in points if c.ts >= progress], default=progress)
        entry = AttemptLedger(
            number=attempt.number, kind=kind, nodes=list(attempt.nodes), started_at=start,
            first_progress=progress, ended_at=end, productive_s=kept_until - progress,
            lost_s=end - kept_until, gap_before_s=0.0, startup_s=0.0,
            checkpoints=len(points), save_interval_s=_median_interval(points),
            restart=attempt.restart, in_place=attempt.in_place, slow=dict(attempt.slow))
        # a restart in place's class is jobwrap run's word: kept apart from root's
        label = f"{IN_PLACE}{kind}" if attempt.in_place else kind
        if previous_end is None:
            entry.startup_s = progress - start
        else:
            entry.gap_before_s = progress - previous_end
            ledger.gaps_by_class.setdefault(previous_kind, []).append(entry.gap_before_s)
        if kind not in (SUCCESS, RUNNING_CLASS):
            ledger.failures += 1
            ledger.lost_by_class[label] = ledger.lost_by_class.get(label, 0.0) + entry.lost_s
        ledger.attempts.append(entry)
        previous_end, previous_kind = end, label
    first = ledger.attempts[0].started_at
    ledger.wall_s = ledger.attempts[-1].ended_at - first
    ledger.productive_s = sum(a.productive_s for a in ledger.attempts)
    ledger.lost_s = sum(a.lost_s for a in ledger.attempts)
    ledger.gap_s = sum(a.gap_before_s for a in ledger.attempts)
    ledger.startup_s = sum(a.startup_s for a in ledger.attempts)
    ledger.ettr = min(1.0, ledger.productive_s / ledger.wall_s) if ledger.wall_s > 0 else 0.0
    intervals = [a.save_interval_s for a in ledger.attempts if a.save_interval_s is not None]
    ledger.checkpoint_interval_s = _median(intervals) if intervals else None
    saves = [c.save_s for a in ordered for c in a.checkpoints if c.save_s is not None]
    ledger.save_s = _median(saves) if saves else None
    paths = [c for a in ordered for c in a.checkpoints if c.path]
    ledger.latest_checkpoint = max(paths, key=lambda c: c.ts).path if paths else None
    return ledger


# What ``jobwrap report`` needs of an attempt, in this order: the archive index keeps
# ledgers so, a few hundred bytes a job.
_BRIEF = ("number", "kind", "nodes", "started_at", "ended_at", "productive_s", "lost_s",
          "checkpoints", "restart", "in_place", "slow")
# the lengths of rows older indexes made: before restarts in place were cut (8), before
# slow nodes were named (10); a row's missing fields take their defaults
_BRIEF_LENGTHS = frozenset({8, 10, len(_BRIEF)})


def ledger_brief(ledger: Ledger) -> dict[str, Any]:
    """The ledger's totals and each attempt's class, nodes, times, goodput shares and
    checkpoint count: what ``report.build`` reads; ``ledger_from_brief`` reads it back."""
    return {"wall_s": ledger.wall_s, "productive_s": ledger.productive_s,
            "lost_s": ledger.lost_s, "ettr": ledger.ettr, "failures": ledger.failures,
            "lost_by_class": ledger.lost_by_class, "gaps_by_class": ledger.gaps_by_class,
            "attempts": [[getattr(a, key) for key in _BRIEF] for a in ledger.attempts]}


def ledger_from_brief(data: dict[str, Any]) -> Ledger:
    """A ledger back from ``ledger_brief``: what ``report.build`` reads, the rest left at
    its default. Built by setting each record's fields whole (``_filled``): ``jobwrap
    report`` makes a few hundred thousand of them, and the records' generic ``__init__``
    was half its time."""
    attempts = [_filled(AttemptLedger, _ATTEMPT_DEFAULTS,
                        zip(_BRIEF[:len(row)] if len(row) in _BRIEF_LENGTHS else _BRIEF,
                            row, strict=True))
                for row in data.get("attempts") or []]
    for attempt in attempts:
        attempt.first_progress = attempt.started_at
        if "slow" not in vars(attempt):
            attempt.slow = {}  # a fresh dict each: never one default shared
    return _filled(Ledger, {"gap_s": 0.0, "startup_s": 0.0, "checkpoint_interval_s": None,
                            "save_s": None, "latest_checkpoint": None},
                   ((key, data[key]) for key in _LEDGER_BRIEF), attempts=attempts)


_LEDGER_BRIEF = ("wall_s", "productive_s", "lost_s", "ettr", "failures", "lost_by_class",
                 "gaps_by_class")
_ATTEMPT_DEFAULTS = {"gap_before_s": 0.0, "startup_s": 0.0, "save_interval_s": None,
                     "restart": 0, "in_place": False}
_Record = TypeVar("_Record")


def _filled(cls: type[_Record], defaults: dict[str, Any], items: Iterable[tuple[str, Any]],
            **more: Any) -> _Record:
    record = cls.__new__(cls)
    vars(record).update(defaults, **more)
    vars(record).update(items)
    return record


def from_summaries(summaries: Iterable[AttemptSummary | dict[str, Any]]) -> list[Attempt]:
    """The adapter: ``AttemptSummary`` records (from ``jobwrap status`` or a manifest's
    ``attempts``) -> the ledger's attempts. Attempts with no known start are skipped."""
    out: list[Attempt] = []
    previous_step: int | None = None
    for item in summaries:
        data = item if isinstance(item, dict) else item.as_dict()
        number = _int(data.get("attempt"))
        start = _num(data.get("started_at"))
        if number is None or start is None:
            continue
        points = []
        for c in data.get("checkpoint_list") or []:
            ts = _num(c.get("ts")) if isinstance(c, dict) else None
            if ts is not None:
                path = c.get("path")
                points.append(Checkpoint(ts, _int(c.get("step")), _num(c.get("save_s")),
                                         str(path) if path else None))
        ended = _num(data.get("ended_at")) if data.get("status") == "ended" else None
        kind = data.get("outcome")
        speed, named = data.get("speed"), data.get("slow")
        slow = tuple((n, float(speed[n])) for n in named if isinstance(n, str)
                     and isinstance(speed.get(n), int | float)) \
            if isinstance(speed, dict) and isinstance(named, list) else ()
        out.extend(_in_place(Attempt(
            number=number, started_at=start, ended_at=ended, kind=str(kind) if kind else None,
            checkpoints=tuple(points), nodes=tuple(str(n) for n in data.get("nodes") or []),
            resumed_step=previous_step if number > 0 else None, slow=slow),
            data.get("in_place")))
        latest = _int(data.get("latest_step"))
        previous_step = latest if latest is not None else previous_step
    return out


def _in_place(attempt: Attempt, restarts: Any) -> list[Attempt]:
    """``attempt`` cut at ``jobwrap run``'s restarts inside it: one part per command run,
    each ended by the class jobwrap run gave its failure; the work after the last
    checkpoint before each restart is lost, the relaunch a gap, as for a requeue. Each
    part after a restart resumed from the newest checkpoint before it."""
    cuts = []
    for claim in restarts or []:
        relaunched = _num(claim.get("ts")) if isinstance(claim, dict) else None
        if relaunched is None or relaunched <= attempt.started_at or (
                attempt.ended_at is not None and relaunched >= attempt.ended_at):
            continue
        failed = min(_num(claim.get("ended_at")) or relaunched, relaunched)
        cuts.append((relaunched, failed, str(claim.get("kind") or "unknown")))
    if not cuts:
        return [attempt]
    parts, start, resumed = [], attempt.started_at, attempt.resumed_step
    for index, (relaunched, failed, kind) in enumerate(sorted(cuts)):
        mine = tuple(c for c in attempt.checkpoints if start <= c.ts < relaunched)
        parts.append(replace(attempt, started_at=start, ended_at=max(failed, start), kind=kind,
                             checkpoints=mine, resumed_step=resumed, restart=index,
                             in_place=True))
        before = [c.step for c in attempt.checkpoints if c.ts <= failed and c.step is not None]
        resumed = max(before) if before else 0 if attempt.number == 0 else resumed
        start = relaunched
    rest = tuple(c for c in attempt.checkpoints if c.ts >= start)
    parts.append(replace(attempt, started_at=start, checkpoints=rest, resumed_step=resumed,
                         restart=len(cuts)))
    return parts


def _from_step(attempt: Attempt) -> int | None:
    """The step the attempt started from: 0 for the first, the resumed one after."""
    return 0 if attempt.fresh else attempt.resumed_step


def _own_checkpoints(attempt: Attempt) -> tuple[Checkpoint, ...]:
    """The checkpoints the attempt wrote: not the one it resumed from, which its
    supervisor reports again when it first looks (seconds after the start, no work yet)."""
    since = _from_step(attempt)
    if since is None or attempt.fresh:
        return attempt.checkpoints
    return tuple(c for c in attempt.checkpoints if c.step is None or c.step > since)


def _first_progress(attempt: Attempt, points: list[Checkpoint], rate: float | None) -> float:
    """When the attempt was at work: measured, or back-reckoned from its first checkpoint
    at the job's step rate (its start-up, the imports and the checkpoint load, excluded)."""
    if attempt.first_progress is not None:
        return attempt.first_progress
    if not points:
        return attempt.started_at
    first, since = points[0], _from_step(attempt)
    if since is None:
        return first.ts
    if rate is None or first.step is None or first.step < since:
        # A fresh start works from its start (only what follows the last checkpoint of a
        # failure is lost); a resumed one from its first checkpoint, at the latest.
        return attempt.started_at if attempt.fresh else first.ts
    return first.ts - (first.step - since) / rate


def _step_rate(own: Sequence[Sequence[Checkpoint]]) -> float | None:
    """Steps per second, the median over the job's consecutive checkpoints in an attempt."""
    rates = []
    for checkpoints in own:
        points = sorted((c for c in checkpoints if c.step is not None), key=lambda c: c.ts)
        for a, b in itertools.pairwise(points):
            if b.ts > a.ts and a.step is not None and b.step is not None and b.step > a.step:
                rates.append((b.step - a.step) / (b.ts - a.ts))
    return _median(rates) if rates else None


def _median_interval(points: list[Checkpoint]) -> float | None:
    gaps = [b.ts - a.ts for a, b in itertools.pairwise(points) if b.ts > a.ts]
    return _median(gaps) if gaps else None


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None


def _num(value: Any) -> float | None:
    try:
        number = float(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None
    return number if number is not None and number == number and abs(number) < 1e12 else None
