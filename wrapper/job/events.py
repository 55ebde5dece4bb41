"""The job's events, typed: one small frozen dataclass per kind, and the registry.

An event is one JSON line ``{"ts": ..., "event": KIND, ...fields}`` in root's
``events.jsonl`` or the user's ``user-events.jsonl`` (see ``wrapper.job.paths``). Writers
build the dataclass and ``encode`` it; readers ``decode`` a line into its class, and a
kind this version does not know (an older or newer jobwrap, or anything the user wrote)
decodes to ``Unknown`` instead of failing. A field of the wrong type, or missing, takes
its default: a user's line can never make a reader raise.

``WRITER`` says who writes the kind: ``root`` (root's hooks; facts the decisions may use),
``user`` (the task-prolog or the supervisor with the job user's rights: claims only).
docs/events.md is generated from this registry by tools/events-doc.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import field
from typing import Any, ClassVar, TypeVar

from wrapper.fastdataclass import (
    dataclass,  # ~45 kinds: no generated code (see wrapper.fastdataclass)
)

REGISTRY: dict[str, type[Event]] = {}
E = TypeVar("E", bound="Event")


def kind(name: str, writer: str) -> Callable[[type[E]], type[E]]:
    """Register an event class under ``name`` (its ``"event"`` value)."""

    def register(cls: type[E]) -> type[E]:
        if name in REGISTRY:
            raise ValueError(f"event kind {name!r} registered twice")
        cls.KIND, cls.WRITER = name, writer
        REGISTRY[name] = cls
        return cls

    return register


@dataclass(frozen=True)
class Event:
    """Fields every event has; ``ts`` and ``source`` are set on write and on read."""

    KIND: ClassVar[str] = ""
    WRITER: ClassVar[str] = "root"
    OPEN: ClassVar[bool] = False  # extra fields kept in ``extra`` (a report's own fields)
    attempt: int = 0
    node: str = ""
    ts: float = field(default=0.0, compare=False)
    source: str = field(default="root", compare=False)  # "root" or "user": the file it is in
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def encode(self) -> dict[str, Any]:
        """The fields to write (without ``ts``, which the store adds, and ``source``)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in ("ts", "source", "extra")}
        return {**data, **self.extra}

    @property
    def from_root(self) -> bool:
        return self.source == "root"


@dataclass(frozen=True)
class Unknown(Event):
    """A kind this version does not know; its fields are all in ``extra``."""

    name: str = ""


def decode(record: Mapping[str, Any]) -> Event:
    """One JSON record as its event class (never raises; unknown kinds -> ``Unknown``)."""
    name = record.get("event")
    cls = REGISTRY.get(name) if isinstance(name, str) else None
    ts = record.get("ts")
    common: dict[str, Any] = {
        "ts": float(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) else 0.0,
        "source": "user" if record.get("source") == "user" else "root"}
    if cls is None:
        rest = {k: v for k, v in record.items() if k not in ("event", "ts", "source")}
        return Unknown(name=str(name), extra=rest, attempt=_int(record.get("attempt")),
                       node=_str(record.get("node")), **common)
    values: dict[str, Any] = {}
    declared = {f.name: f for f in dataclasses.fields(cls)}
    for name_, spec in declared.items():
        if name_ in ("ts", "source", "extra") or name_ not in record:
            continue
        value = record[name_]
        if _fits(value, _default(spec), str(spec.type)):
            values[name_] = value
    if cls.OPEN:
        values["extra"] = {k: v for k, v in record.items()
                           if k not in declared and k not in ("event", "ts", "source")}
    return cls(**values, **common)


def attempt_of(record: Mapping[str, Any]) -> int | None:
    """The attempt a record names, before ``decode`` defaults it: its ``attempt``, else
    (none there) its hook context's; None when it names none, or no whole number."""
    value = record.get("attempt")
    if value is None:
        context = record.get("context")
        value = context.get("attempt") if isinstance(context, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def decode_attempts(records: Iterable[Mapping[str, Any]]) -> list[Event]:
    """``decode`` of the records that name an attempt (``attempt_of``), each with that
    attempt: what the story of the attempts (``wrapper.archive.status``) is told from.
    ``decode`` alone reads a line without an attempt as attempt 0; here such a line
    belongs to no attempt and is left out."""
    out: list[Event] = []
    for record in records:
        number = attempt_of(record)
        if number is None:
            continue
        event = decode(record)
        out.append(event if event.attempt == number else
                   dataclasses.replace(event, attempt=number))
    return out


def _default(spec: dataclasses.Field[Any]) -> Any:
    if spec.default is not dataclasses.MISSING:
        return spec.default
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return None


_OPTIONAL = {"int | None": (int,), "str | None": (str,), "float | None": (int, float)}


def _fits(value: Any, default: Any, annotation: str) -> bool:
    if default is None:  # an optional field: None, or a value of its type
        allowed = _OPTIONAL.get(annotation)
        return value is None or allowed is None or (
            isinstance(value, allowed) and not isinstance(value, bool))
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, type(default))


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


# -- shared shapes (not kinds themselves) --------------------------------------------------
@dataclass(frozen=True)
class _Failed(Event):
    error: str = ""


@dataclass(frozen=True)
class _HookContext(Event):
    hook: str = ""
    context: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Staged(Event):
    OPEN: ClassVar[bool] = True
    cache_hits: int = 0


@dataclass(frozen=True)
class _Faults(Event):
    faults: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _BySupervisor(Event):
    hook: str = "supervisor"


# -- root's hooks ---------------------------------------------------------------------------
@kind("prolog.context", writer="root")
@dataclass(frozen=True)
class PrologContext(_HookContext):
    """A prolog started on a node: the attempt begins (the attempt number's source)."""


@kind("prolog.unhealthy", writer="root")
@dataclass(frozen=True)
class PrologUnhealthy(Event):
    """The prolog's health check failed: the node is drained, Slurm requeues the job."""

    reason: str | None = None


@kind("directives.invalid", writer="root")
@dataclass(frozen=True)
class DirectivesInvalid(_Failed):
    """The job's #JOBWRAP directives could not be parsed: the job is refused."""


@kind("health", writer="root")
@dataclass(frozen=True)
class Health(Event):
    """A node health check ran (prolog or epilog phase) and its verdict."""

    phase: str = ""
    verdict: str = ""
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    versions: list[Any] = field(default_factory=list)


@kind("health.unavailable", writer="root")
@dataclass(frozen=True)
class HealthUnavailable(_Failed):
    """The checks could not run (jobwrap's or the site's problem, not the node's)."""


@kind("scratch.unavailable", writer="root")
@dataclass(frozen=True)
class ScratchUnavailable(_Failed):
    """The job's scratch could not be made (the site's setup, not the node)."""


@kind("supervisor.started", writer="root")
@dataclass(frozen=True)
class SupervisorStarted(Event):
    """The prolog started the attempt's supervisor (``systemd`` or ``detached:PID``)."""

    how: str = ""


@kind("supervisor.restarted", writer="root")
@dataclass(frozen=True)
class SupervisorRestarted(Event):
    """The first node's watcher started the attempt's supervisor again: it had died
    without ending (``wrapper.watch.keeper``); ``restarts``: how many times this attempt."""

    how: str = ""
    restarts: int = 0


@kind("staging.in", writer="root")
@dataclass(frozen=True)
class StagingIn(_Staged):
    """Stage-in finished; the staging report's fields are in ``extra``."""


@kind("staging.out", writer="root")
@dataclass(frozen=True)
class StagingOut(_Staged):
    """Stage-out finished; the staging report's fields are in ``extra``."""


@kind("staging.failed", writer="root")
@dataclass(frozen=True)
class StagingFailed(Event):
    """Staging failed; ``direction`` "in" refuses the job (its data is not there)."""

    direction: str = ""
    error: str = ""


@kind("staging.cache_unusable", writer="root")
@dataclass(frozen=True)
class StagingCacheUnusable(_Failed):
    """The node's dataset cache failed; the job was staged without it."""


@kind("staging.kept", writer="root")
@dataclass(frozen=True)
class StagingKept(Event):
    """Stage-out was incomplete: the scratch is kept in quarantine until ``until``."""

    path: str = ""
    until: int = 0
    problems: list[str] = field(default_factory=list)


@kind("scratch.removed", writer="root")
@dataclass(frozen=True)
class ScratchRemoved(Event):
    """The job's scratch on this node was removed."""

    files: int = 0
    dirs: int = 0
    left: int = 0
    complete: bool = False


@kind("epilog.context", writer="root")
@dataclass(frozen=True)
class EpilogContext(_HookContext):
    """An epilog started on a node."""


@kind("gpu.confirmed", writer="root")
@dataclass(frozen=True)
class GpuConfirmed(_Faults):
    """Root's own probe confirmed a reported GPU fault."""


@kind("gpu.not_confirmed", writer="root")
@dataclass(frozen=True)
class GpuNotConfirmed(_Faults):
    """Root's own probe found no fault behind a reported one."""


@kind("attempt.end", writer="root")
@dataclass(frozen=True)
class AttemptEnd(Event):
    """The epilog's verdict on an attempt: its class and the restart decision."""

    kind: str = ""
    detail: str = ""
    signature: str = ""
    exit_code: int | None = None
    exit_signal: int | None = None
    slurm_state: str = ""
    checkpoint_path: str | None = None
    checkpoint_step: int | None = None
    decision: str = ""
    reason: str = ""
    exclude: list[str] = field(default_factory=list)


@kind("resume.chosen", writer="root")
@dataclass(frozen=True)
class ResumeChosen(Event):
    """Root's pick of the checkpoint an attempt resumes from (the prolog, on the job's first
    node, looks it up as the user); ``passed_over``: newer ones skipped as suspect."""

    path: str = ""
    step: int | None = None
    mtime: float = 0.0
    passed_over: list[str] = field(default_factory=list)


@kind("checkpoint.suspect", writer="root")
@dataclass(frozen=True)
class CheckpointSuspect(Event):
    """An attempt resumed from this checkpoint and failed, by its own fault, before a newer
    one appeared: later attempts resume from an older one (nothing is deleted)."""

    path: str = ""
    step: int | None = None
    mtime: float = 0.0
    fallback: str = ""
    reason: str = ""


@kind("hang.forensics", writer="root")
@dataclass(frozen=True)
class HangForensics(Event):
    """The first node's reading of every node's forensics of a hung attempt: the rank(s)
    whose stack stands apart from the majority (``odd``), and why; ``flight``: the ranks
    the flight recorder's dumps say never joined a collective the others entered."""

    nodes: list[str] = field(default_factory=list)
    ranks: int = 0
    odd: list[str] = field(default_factory=list)
    why: str = ""
    # the flight recorder's word, where ranks dumped it: the ranks that never joined
    flight: list[str] = field(default_factory=list)


# -- root's node watchers (wrapper/watch/) ---------------------------------------------------
@kind("watch.started", writer="root")
@dataclass(frozen=True)
class WatchStarted(Event):
    """The prolog started this node's root fault feed (pid: the watcher's)."""

    pid: int = 0


@kind("watch.fault", writer="root")
@dataclass(frozen=True)
class WatchFault(_Faults):
    """The node's watcher saw a GPU fault mid-run (an Xid, NVML health): it drains the node
    with ``reason`` and ends the job."""

    reason: str = ""


@kind("pulse.lost", writer="root")
@dataclass(frozen=True)
class PulseLost(Event):
    """The hub (the first node's watcher) heard nothing from node ``lost`` for
    ``silent_s`` seconds over an open connection: the node is lost (wrapper/pulse/)."""

    lost: str = ""
    silent_s: float = 0.0


@kind("pulse.down", writer="root")
@dataclass(frozen=True)
class PulseDown(Event):
    """``[pulse] fence_grace`` after a loss, the hub set node ``lost`` DOWN in Slurm with
    ``reason`` (``error``: Slurm refused, or could not be asked)."""

    lost: str = ""
    reason: str = ""
    error: str = ""


@kind("pulse.hang", writer="root")
@dataclass(frozen=True)
class PulseHang(Event):
    """The first node's judge of every node's samples (wrapper/pulse/judge.py): the job's
    ranks were stuck for ``held_s`` s (``window_s``: what it takes), ``stuck`` the rank(s)
    named (``flight``: by the flight recorder's dumps, where ranks wrote them); the
    supervisor ends the hang as its own."""

    stuck: list[str] = field(default_factory=list)
    ranks: int = 0
    waiting: int = 0
    held_s: float = 0.0
    window_s: float = 0.0
    why: str = ""
    flight: list[str] = field(default_factory=list)  # ranks the flight recorder names


@kind("pulse.slow", writer="root")
@dataclass(frozen=True)
class PulseSlow(Event):
    """The first node's judge named node ``slow``: its ranks ran at ``score`` of the job's
    typical rank's speed (CPU demand over ``window_s`` s) for ``held_s`` s; ``scores``:
    every node's then."""

    slow: str = ""
    score: float = 1.0
    scores: dict[str, float] = field(default_factory=dict)
    window_s: float = 0.0
    held_s: float = 0.0


@kind("pulse.speed", writer="root")
@dataclass(frozen=True)
class PulseSpeed(Event):
    """Every node's newest speed score in the attempt (1.0 = as fast as the job's typical
    rank), recorded by the first node's epilog from its judge's file; ``named``: the nodes
    it named slow."""

    scores: dict[str, float] = field(default_factory=dict)
    named: list[str] = field(default_factory=list)
    window_s: float = 0.0


@kind("pulse.fenced", writer="root")
@dataclass(frozen=True)
class PulseFenced(Event):
    """This node's watcher heard no ack from the hub for ``silent_s`` seconds (or the hub
    judged the node lost): it killed the job's ``killed`` processes on this node."""

    silent_s: float = 0.0
    why: str = ""
    killed: int = 0


@kind("watch.ended_job", writer="root")
@dataclass(frozen=True)
class WatchEndedJob(Event):
    """The watcher ended the job after a fault on its node."""

    reason: str = ""


@kind("watch.forensics", writer="root")
@dataclass(frozen=True)
class WatchForensics(Event):
    """The node's part of a hang's forensics: each rank's stack signature (py-spy, as the
    job's user), the flight recorder's dumps of the node's ranks (``flight``, where they
    wrote one), the problems met, and the seconds it took."""

    ranks: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    flight: list[dict[str, Any]] = field(default_factory=list)  # the recorder's dumps, per rank


@kind("requeue.failed", writer="root")
@dataclass(frozen=True)
class RequeueFailed(_Failed):
    """Slurm refused the requeue the decision asked for."""


@kind("requeue.external", writer="root")
@dataclass(frozen=True)
class RequeuedWithoutJobwrap(Event):
    """Slurm's Restarts moved past the attempt that ended without jobwrap's decision: the
    job requeued itself (Lightning's auto-requeue: ``scontrol requeue`` on USR1), an admin
    did, or Slurm did (a node failure). jobwrap does not requeue it a second time, and
    makes it eligible at once (``jobwrap release``) only within the job's restart limit."""

    restarts: int = 0  # Slurm's Restarts when the epilog looked
    slurm_state: str = ""
    kind: str = ""  # how jobwrap classed the attempt all the same
    reason: str = ""


def prolog_skipped(node: str, attempt: int) -> str:
    """The one wording of an attempt Slurm started on ``node`` without jobwrap's prolog:
    the job's output, root's record of it and the epilog's verdict all say this."""
    return (f"jobwrap's prolog did not run on {node} for attempt {attempt} (slurmd before "
            f"23.02 skips it for a job requeued back onto a node within seconds)")


def did_not_start(job_id: str, node: str, attempt: int) -> str:
    """How the task-prolog's line in the job's output begins when it ends a task on
    ``node`` for a prolog that did not run there: the first node's epilog reads it back
    (``claimed_unchecked``). It names the job: array tasks may share one output file
    (``--open-mode=append``), and another job's line must never count for this one."""
    return f"jobwrap: job {job_id} did not start on {node}: {prolog_skipped(node, attempt)}"


# did_not_start's line, with srun's optional --label prefix ("1: ", " 1: " padded to the
# widest task id, "P0  1: " in a heterogeneous job); the node named twice
_DID_NOT_START = re.compile(r"^(?:P\d{1,3} +)?(?: {0,7}\d{1,7}: )?jobwrap: job "
                            r"(?P<job>\d{1,10}) did not start on "
                            r"(?P<node>[A-Za-z0-9._-]{1,64}): jobwrap's prolog did not run "
                            r"on (?P=node) for attempt (?P<attempt>\d{1,6}) ", re.M)


def claimed_unchecked(text: str, job_id: str, attempt: int) -> list[str]:
    """The nodes whose task-prolog said in ``text`` (the job's output) that it ended
    ``attempt``'s tasks of job ``job_id`` there, unchecked: the job's words, for the
    caller to weigh. Lines of other jobs (array tasks sharing one output) do not count."""
    return sorted({m["node"] for m in _DID_NOT_START.finditer(text)
                   if m["job"] == job_id and int(m["attempt"]) == attempt})


@kind("attempt.unchecked", writer="root")
@dataclass(frozen=True)
class AttemptUnchecked(Event):
    """The epilog found no prolog record of the attempt on its node: Slurm skipped the
    Prolog there (slurmd before 23.02, a job requeued back onto the node within seconds),
    and the task-prolog ended the attempt's tasks on it before the job's code ran."""

    reason: str = ""
    excluded: bool = False  # a release excluding this node was started


@kind("archive", writer="root")
@dataclass(frozen=True)
class Archived(Event):
    """This node's part of the attempt's archive was written."""

    path: str = ""
    complete: bool = False
    files: int = 0
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0


# -- the job user's side (claims, never facts) ----------------------------------------------
@kind("task-prolog.context", writer="user")
@dataclass(frozen=True)
class TaskPrologContext(Event):
    """A task-prolog ran (as the job user): what it exported and the user's environment."""

    OPEN: ClassVar[bool] = True  # "environment" on the node's first task
    hook: str = ""
    uid: int = -1
    step: str = ""
    task: str = ""
    context: dict[str, Any] = field(default_factory=dict)
    exports: dict[str, str] = field(default_factory=dict)


@kind("run.started", writer="user")
@dataclass(frozen=True)
class RunStarted(Event):
    """``jobwrap run`` started the job's command: it restarts it inside the allocation.
    The user's word: it tells a job that did not use it what it would gain, and it lets a
    hang or a spare node's fault end only the job's steps (the supervisor, as the user;
    a watcher, only for a job root's record gives spares): a lie changes how the user's
    own steps end, never root's verdict (docs/security.md rows 26-27)."""

    command: str = ""
    spare_nodes: int = 0  # the nodes it holds in reserve (--spare-nodes), 0: none


@kind("run.restarted", writer="user")
@dataclass(frozen=True)
class RunRestarted(Event):
    """``jobwrap run`` started its command again inside the allocation (in place, or onto
    a spare). The user's word: the supervisor only starts timing the new command's
    start-up afresh, as after a hang it restarted itself (a lie costs the user's own job
    a slower hang verdict)."""

    restart: int = 0  # jobwrap run's own count within the Slurm attempt: 1, 2, ...
    # What ended the command before it (jobwrap run's class) and when: the ledger's
    # boundary inside the attempt (a report, never a control input)
    kind_ended: str = ""
    ended_at: float = 0.0


@kind("run.stopped", writer="user")
@dataclass(frozen=True)
class RunStopped(Event):
    """``jobwrap run``'s brakes stopped its restarts inside the allocation (the same error,
    no progress, its restart limit). The user's word, and it can only stop the job: the
    epilog then does not requeue an attempt the job's own fault ended (``RunStopped``
    never spares a job a brake, it only saves a second round of them in the queue)."""

    kind_ended: str = ""  # the class of the failure it stopped on
    reason: str = ""


@kind("run.spare_used", writer="user")
@dataclass(frozen=True)
class SpareUsed(Event):
    """``jobwrap run`` gave a faulty node back and restarted the work with a spare in its
    place, inside the allocation. The user's word; root decides nothing from it."""

    failed: list[str] = field(default_factory=list)
    reason: str = ""
    replaced_by: list[str] = field(default_factory=list)
    spares_left: int = 0
    working: int = 0  # the nodes the work runs on (a later attempt's count, too)


@kind("supervisor.start", writer="user")
@dataclass(frozen=True)
class SupervisorStart(_BySupervisor):
    """The supervisor began following the attempt."""
    pid: int = 0
    hang_timeout_s: float | None = None
    checkpoint_dir: str | None = None


@kind("supervisor.end", writer="user")
@dataclass(frozen=True)
class SupervisorEnd(_BySupervisor):
    """The supervisor saw the attempt end (or a later one start)."""
    job_state: str = ""
    last_checkpoint: str | None = None
    step: int | None = None


@kind("checkpoint", writer="user")
@dataclass(frozen=True)
class Checkpoint(_BySupervisor):
    """A new valid checkpoint appeared; ``save_s``: how long saving it took, when
    something measured it (the goodput advice reads it)."""
    path: str = ""
    step: int | None = None
    layout: str = ""
    save_s: float | None = None


@kind("hang", writer="user")
@dataclass(frozen=True)
class Hang(_BySupervisor):
    """No progress for the hang timeout: the supervisor ended the job, or only its steps
    when ``hang.in_place`` follows (also a fact)."""
    idle_s: float = 0.0
    hang_timeout_s: float = 0.0
    learned: bool = False  # the timeout was learned from the job's cadence, not fixed
    cadence_s: float = 0.0  # the longest gap between two signs of progress seen
    last_checkpoint: str | None = None
    found_by: str = "supervisor"  # or "pulse": the judge of every rank's samples
    stuck: list[str] = field(default_factory=list)  # the ranks the pulse named


@kind("hang.in_place", writer="user")
@dataclass(frozen=True)
class HangInPlace(_BySupervisor):
    """The job runs under ``jobwrap run``: after the hang (and its forensics) the
    supervisor killed the job's steps only, and ``jobwrap run`` restarts its command in
    the allocation (also a fact: the hang before it did not end the job)."""
    steps: list[str] = field(default_factory=list)


@kind("gpu.fault", writer="user")
@dataclass(frozen=True)
class GpuFault(_BySupervisor):
    """The supervisor saw a GPU fault under the job and ended it (also a fact)."""
    reason: str = ""


@kind("walltime.signal", writer="user")
@dataclass(frozen=True)
class WalltimeSignal(_BySupervisor):
    """The supervisor sent the job its pre-timeout signal (and touched its save file)."""
    signal: str = ""
    seconds_left: int = 0
    save_file: str = ""


@kind("walltime.requeued", writer="user")
@dataclass(frozen=True)
class WalltimeRequeued(_BySupervisor):
    """A checkpoint newer than the save request was complete before the time limit: the
    supervisor requeued the job then, rather than let it train on to the limit."""
    checkpoint: str | None = None
    seconds_left: int = 0


# The supervisor's reports root acts on, through its root-owned channel (wrapper.job.facts).
FACT_KINDS = frozenset({Hang.KIND, HangInPlace.KIND, GpuFault.KIND})
# What keeps a job from starting on a node: its data or its directives.
REFUSALS = (StagingFailed.KIND, DirectivesInvalid.KIND)
