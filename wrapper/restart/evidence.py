"""Everything the restart decision reads, gathered in one place: all of its I/O.

Slurm's record of the job, the tail of the job's output (read with the user's rights,
bounded, non-blocking), root's events and the supervisor's facts, root's own GPU probe
when a reported fault needs confirming, and the latest valid checkpoint (as the user).
What comes back (``Gathered``) is plain data: ``classify`` and ``policy`` decide from it
without touching anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import field
from typing import TYPE_CHECKING

from wrapper import log
from wrapper.errors import JobwrapError
from wrapper.fastdataclass import dataclass
from wrapper.job import events as ev
from wrapper.restart import oom
from wrapper.restart.classify import Evidence, reports_gpu_fault
from wrapper.restart.policy import PastAttempt
from wrapper.restart.resume import Found, Suspect
from wrapper.slurm.records import SlurmJob

if TYPE_CHECKING:
    from wrapper.config import Config
    from wrapper.job.record import JobRecord
    from wrapper.job.store import JobStore
    from wrapper.osl.users import UserIds
    from wrapper.slurm import SlurmBackend
    from wrapper.slurm.context import JobContext

OUTPUT_TAIL_BYTES = 65536  # of the job's output, read to classify the attempt
USER_IO_TIMEOUT = 10.0  # seconds a read or write of the job's output may take
# Seconds before its time limit within which a job that requeued itself is taken to have
# done it for the limit (Lightning's docs use --signal=SIGUSR1@90; sites up to minutes).
SELF_REQUEUE_WINDOW = 600.0

# Root's own probe of the job's GPUs: node, GPUs -> the faults found (raises if it cannot).
GpuConfirmer = Callable[[str, Sequence[int]], list[str]]


@dataclass(frozen=True)
class Gathered:
    evidence: Evidence
    job: SlurmJob  # Slurm's record (empty fields when Slurm could not be asked)
    info: dict[str, str] = field(default_factory=dict)  # the raw record, for the archive
    history: list[PastAttempt] = field(default_factory=list)
    checkpoint: Found | None = None  # the latest valid one, suspects passed over
    # The checkpoint this attempt resumed from (root's pick) when nothing newer appeared
    # since, and the newest valid one older than it: where a fallback would resume.
    resumed: Found | None = None
    older: Found | None = None


def gather(ctx: JobContext, cfg: Config, store: JobStore, record: JobRecord,
           backend: SlurmBackend, user: UserIds, *, gpu_check_failed: bool,
           gpu_checked: bool, confirm: GpuConfirmer | None = None) -> Gathered:
    """``gpu_check_failed``: root's post-job check on this node failed; ``gpu_checked``: it
    ran (else a reported GPU fault is confirmed by a probe of root's own here)."""
    from wrapper.job.facts import supervisor_facts

    events = store.events()
    supervisor_events = supervisor_facts(store.state, ctx.attempt)
    claims = {e.KIND for e in events if not e.from_root and e.attempt == ctx.attempt}
    unconfirmed = tuple(f"{name} in the job's own event file" for name in
                        sorted(claims & ev.FACT_KINDS - set(supervisor_events)))
    info: dict[str, str] = {}
    try:
        info = backend.job_info(ctx.job_id)
    except JobwrapError as exc:
        log.get().warning("epilog.job_info_unavailable", error=str(exc))
    raw = output_tail(record, user)
    tail = this_attempt(raw, ctx.attempt)
    if not gpu_check_failed and not gpu_checked and (
            ev.GpuFault.KIND in supervisor_events or ev.GpuFault.KIND in claims
            or reports_gpu_fault(tail)):
        gpu_check_failed = _confirm_gpu_fault(ctx, cfg, store, confirm)
    job = SlurmJob.of(info)
    unchecked = _unchecked(ctx, cfg, store, events)
    elsewhere: tuple[str, ...] = ()
    if not unchecked:
        elsewhere = _claimed_unchecked(ctx, cfg, store, events, raw)
        unchecked = "; ".join(f"{ev.prolog_skipped(node, ctx.attempt)}, as its task-prolog "
                              "wrote in the job's output" for node in elsewhere)
    evidence = Evidence(exit_code=ctx.exit_code, exit_signal=ctx.exit_signal,
                        staging_error=_refusal(store, ctx.attempt, events),
                        unchecked=unchecked, unchecked_elsewhere=elsewhere,
                        slurm_state=job.final_state, supervisor_events=supervisor_events,
                        gpu_check_failed=gpu_check_failed, unconfirmed=unconfirmed,
                        output_tail=tail, job_id=ctx.job_id,
                        requeued_before_limit_s=requeued_before_limit(
                            ctx.attempt, job, info, record, cfg, now=time.time()))
    evidence = oom.with_signals(evidence, ctx.job_id)  # root's OOM-kill facts
    history = [PastAttempt(e.attempt, e.kind, e.signature, e.checkpoint_step,
                           e.checkpoint_path)
               for e in store.history(ctx.attempt, events)]
    suspects = [Suspect.of(e) for e in store.suspects(events)]
    checkpoint = latest_checkpoint(record, user, suspects)
    resumed, older = _fallback(ctx, store, record, user, events, suspects, checkpoint)
    return Gathered(evidence, job, info, history, checkpoint, resumed, older)


def requeued_before_limit(attempt: int, job: SlurmJob, info: dict[str, str],
                          record: JobRecord, cfg: Config, *, now: float) -> float | None:
    """Seconds left before Slurm's time limit (its value now: ``scontrol update`` moves it)
    when Slurm's Restarts says ``attempt`` was requeued without jobwrap within the window
    a save before the limit takes (``walltime_lead``, and at least SELF_REQUEUE_WINDOW for
    a job's own ``--signal=USR1@N`` trap); None otherwise. Root's facts only: Slurm's
    record and the attempt's start in the prolog's."""
    from wrapper.restart.requeued import requeued_without_jobwrap
    from wrapper.slurm.records import time_limit_seconds

    limit = time_limit_seconds(info.get("TimeLimit", "")) or record.time_limit_s
    if not limit or not record.start_time or not requeued_without_jobwrap(attempt, job):
        return None
    left = record.start_time + limit - now
    return left if left <= max(cfg.supervisor.walltime_lead, SELF_REQUEUE_WINDOW) else None


def _refusal(store: JobStore, attempt: int, events: list[ev.Event]) -> str:
    """The first stage-in failure or invalid directives of ``attempt`` on any node."""
    for event in events:
        if event.from_root and event.attempt == attempt and (
                (isinstance(event, ev.StagingFailed) and event.direction == "in")
                or isinstance(event, ev.DirectivesInvalid)):
            return event.error
    return ""


def _unchecked(ctx: JobContext, cfg: Config, store: JobStore, events: list[ev.Event]) -> str:
    """Why this attempt is unchecked here: root has no prolog record of it on this node
    (Slurm skipped the Prolog), and the task-prolog ended it ("" otherwise)."""
    if cfg.hooks.unchecked_attempt != "requeue" or store.prolog_ran(ctx.node, ctx.attempt,
                                                                    events):
        return ""
    return ev.prolog_skipped(ctx.node, ctx.attempt)


def _claimed_unchecked(ctx: JobContext, cfg: Config, store: JobStore,
                       events: list[ev.Event], text: str) -> tuple[str, ...]:
    """The job's other nodes whose task-prolog ended this attempt's tasks there because
    jobwrap's prolog did not run (its line in the job's output), that root's record does
    not contradict: the first node's root sees no other node's record where state is
    node-local, so the line is the only word of it that reaches this decision.

    It is the job's word, and all it can obtain is what the job's user may do to their
    own job without jobwrap: a requeue (at most --max-restarts of them, as for a skip on
    this node) that leaves out a node of its own allocation. It drains nothing, and a node
    whose prolog record root can see (a state folder the nodes share) is not believed."""
    if cfg.hooks.unchecked_attempt != "requeue":
        return ()
    if ctx.attempt > 0:  # this attempt's words (an appended output holds older jobs')
        text = after_banner(text, ctx.attempt)
    return tuple(node for node in ev.claimed_unchecked(text, ctx.job_id, ctx.attempt)
                 if node in ctx.nodes and node != ctx.node
                 and not store.prolog_ran(node, ctx.attempt, events))


def this_attempt(tail: str, attempt: int) -> str:
    """What ``attempt`` wrote of ``tail``: the text after the banner the task prolog prints
    when it starts (``jobwrap: attempt N ...``). With ``--open-mode=append`` the output
    holds every attempt's words, and an earlier attempt's ``task 1: Killed`` must not
    class a later segfault. No banner in the tail (attempt 0, or scrolled out): all of it."""
    import re

    text = after_banner(tail, attempt) if attempt > 0 else tail
    # jobwrap's own lines (the banner, jobwrap run's reports, which name the faults it
    # handled: "n2: jobwrap: xid ... Xid 79") are not the job's words about its failure
    return re.sub(r"^jobwrap(?: run)?: .*(?:\n|$)", "", text, flags=re.M)


def after_banner(tail: str, attempt: int) -> str:
    """``tail`` after the last banner of ``attempt`` in it (all of it when there is none)."""
    import re

    found = None
    for found in re.finditer(rf"^jobwrap: attempt {attempt}[ ;].*$", tail, re.M):  # noqa: B007
        pass
    return tail[found.end():] if found else tail


def output_tail(record: JobRecord, user: UserIds) -> str:
    """The last bytes of the job's output files, read as the job's user."""
    from wrapper.osl.child import call_as
    from wrapper.osl.files import read_tail_text

    tail = ""
    for path in dict.fromkeys([record.stdout, record.stderr]):
        if path:
            try:
                # The user's rights, a no-follow non-blocking open of a regular file only,
                # a bounded tail and a deadline: a FIFO, /dev/zero or a huge file in the
                # output's place cannot hold the epilog.
                tail += call_as(user, read_tail_text, path, OUTPUT_TAIL_BYTES,
                                timeout=USER_IO_TIMEOUT)
            except JobwrapError as exc:
                log.get().warning("epilog.output_unreadable", path=path, error=str(exc))
    return tail


def _confirm_gpu_fault(ctx: JobContext, cfg: Config, store: JobStore,
                       confirm: GpuConfirmer | None) -> bool:
    """A GPU fault was reported and the post-job check did not run: root probes itself."""
    if confirm is None:
        from wrapper.gpu import faults as gpu_faults

        def confirm(node: str, gpus: Sequence[int]) -> list[str]:
            return gpu_faults.confirm(cfg, node, gpus)
    try:
        faults = confirm(ctx.node, ctx.gpus)
    except JobwrapError as exc:  # the probe, not the GPU: nothing is confirmed
        log.get().error("epilog.gpu_unconfirmed", error=str(exc))
        return False
    cls = ev.GpuConfirmed if faults else ev.GpuNotConfirmed
    store.record(cls(attempt=ctx.attempt, node=ctx.node, faults=faults))
    return bool(faults)


def latest_checkpoint(record: JobRecord, user: UserIds,
                      suspects: Sequence[Suspect] = ()) -> Found | None:
    """The latest valid checkpoint not passed over as suspect, looked up as the job user."""
    from wrapper.restart.resume import latest_as

    try:  # the job has ended: nothing is still writing, so no settle time is needed
        return latest_as(user, record.checkpoint_dir, record.job_options, suspects=suspects,
                         timeout=USER_IO_TIMEOUT)
    except JobwrapError as exc:
        log.get().warning("epilog.checkpoints_unreadable", error=str(exc))
        return None


def _fallback(ctx: JobContext, store: JobStore, record: JobRecord, user: UserIds,
              events: list[ev.Event], suspects: list[Suspect], latest: Found | None
              ) -> tuple[Found | None, Found | None]:
    """The checkpoint root chose for this attempt when no newer one has appeared since (it
    may be suspect), and the newest valid one older than it (where a fallback would go)."""
    chosen = store.resumed_from(ctx.attempt, events)
    if chosen is None or latest is None or latest.path != chosen.path \
            or latest.mtime != chosen.mtime:
        return None, None  # nothing resumed, or progress since: nothing to suspect
    resumed = Found(chosen.path, chosen.step, mtime=chosen.mtime)
    now = Suspect(chosen.path, chosen.step, chosen.mtime, time.time())
    return resumed, latest_checkpoint(record, user, [*suspects, now])
