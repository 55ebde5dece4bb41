"""The whole restart decision on an attempt's end, in one place: the first node's epilog
calls ``decide`` (gather the evidence, classify, add what the other nodes say, apply the
policy, defer to a requeue Slurm already made) and then ``act`` (record, requeue).

Which attempt ended is ``wrapper.restart.requeued.ended_attempt`` (the epilog asks it
first, before it records anything); the evidence is ``wrapper.restart.evidence``; the
other nodes' faults and losses ``wrapper.restart.remote``; the pure judgement
``classify`` and ``policy``; the side effects ``wrapper.restart.apply``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from wrapper.job import events as ev
from wrapper.lean import dataclass
from wrapper.restart.classify import UNCHECKED, Classification
from wrapper.restart.policy import Decision

if TYPE_CHECKING:
    from wrapper.config import Config
    from wrapper.job.record import JobRecord
    from wrapper.job.store import JobStore
    from wrapper.osl.users import UserIds
    from wrapper.restart.apply import Spawner
    from wrapper.restart.evidence import Gathered, GpuConfirmer
    from wrapper.slurm import SlurmBackend
    from wrapper.slurm.context import JobContext


@dataclass(frozen=True)
class Outcome:
    verdict: Classification
    decision: Decision
    gathered: Gathered
    # Slurm requeued the job without jobwrap (the job itself, an admin, Slurm): recorded,
    # and not requeued again.
    external: ev.RequeuedWithoutJobwrap | None
    # (resumed from, older valid): the checkpoint it resumed from is suspect
    fallback: tuple[str, str] | None
    user: UserIds


def decide(ctx: JobContext, cfg: Config, store: JobStore, record: JobRecord,
           backend: SlurmBackend, *, gpu_check_failed: bool, gpu_checked: bool,
           confirm: GpuConfirmer | None = None) -> Outcome:
    """Classify the attempt that ended and decide what follows. It acts on nothing; the
    only record it makes is root's own GPU confirmation, when a reported fault needs one.

    ``gpu_check_failed``: root's post-job check on this node failed; ``gpu_checked``: it
    ran (else a reported GPU fault is confirmed by a probe of root's own here)."""
    from wrapper.osl.users import UserIds
    from wrapper.restart import evidence, resume
    from wrapper.restart.classify import classify
    from wrapper.restart.policy import decide as policy_decide
    from wrapper.restart.policy import suspect
    from wrapper.restart.remote import with_remote_faults
    from wrapper.restart.requeued import hold_back

    user = UserIds.of(record.uid, record.gid)
    gathered = evidence.gather(ctx, cfg, store, record, backend, user,
                               gpu_check_failed=gpu_check_failed, gpu_checked=gpu_checked,
                               confirm=confirm)
    verdict = classify(gathered.evidence)
    # A fault a watcher found on another node of the job: hardware, that node excluded.
    verdict, remote = with_remote_faults(
        verdict, backend, ctx, store.root_events(), gathered.info)
    if verdict.kind == UNCHECKED:  # the nodes Slurm skipped the prolog on, if not this one
        remote = {**dict.fromkeys(gathered.evidence.unchecked_elsewhere, "unchecked"),
                  **remote}
    options, checkpoint = record.job_options, gathered.checkpoint
    resumed, older = gathered.resumed, gathered.older
    fallback = (resumed.path, older.path) if resumed and older and suspect(
        verdict, resumed_from=resumed.path,
        checkpoint_path=checkpoint.path if checkpoint else None) else None
    decision = policy_decide(
        verdict, attempt=ctx.attempt, max_restarts=resume.max_restarts(options, cfg),
        # sbatch --no-requeue (or a site's job_submit): Slurm would refuse.
        no_requeue=options.no_requeue or not gathered.job.requeue_allowed,
        history=gathered.history, checkpoint_step=checkpoint.step if checkpoint else None,
        checkpoint_path=checkpoint.path if checkpoint else None,
        node="" if remote else ctx.node, no_progress_limit=cfg.restart.no_progress_limit,
        fallback=fallback, asked=options.max_restarts)
    if remote and decision.requeue:  # exclude those nodes, not this healthy one
        decision = replace(decision, exclude_nodes=sorted(remote))
    decision = after_run_stopped(decision, verdict, store.user_claims(ctx.attempt))
    saved = next((e for e in store.events() if isinstance(e, ev.WalltimeRequeued)
                  and e.attempt == ctx.attempt), None)  # the supervisor's word: wording only
    decision, external = hold_back(decision, verdict, attempt=ctx.attempt, node=ctx.node,
                                   job=gathered.job,
                                   saved=saved.checkpoint or "" if saved else None)
    return Outcome(verdict, decision, gathered, external, fallback, user)


def after_run_stopped(decision: Decision, verdict: Classification,
                      claims: Sequence[ev.Event]) -> Decision:
    """``decision``, or a stop when ``jobwrap run`` already restarted the work inside the
    allocation until its brakes stopped it (``run.stopped``, the user's word: it can only
    stop) and the failure is the job's own: a requeue would only run the same brakes
    again, multiplying --max-restarts. A fault that is not the job's (hardware, a lost
    node, a skipped prolog) is requeued as ever."""
    from wrapper.restart.classify import NOT_THE_JOBS_FAULT

    stopped = next((e for e in reversed(claims) if isinstance(e, ev.RunStopped)), None)
    if stopped is None or not decision.requeue or verdict.kind in NOT_THE_JOBS_FAULT:
        return decision
    return Decision("stop", f"{verdict.kind}: jobwrap run restarted it inside the allocation "
                    f"and stopped ({stopped.reason}); not requeued")


def act(ctx: JobContext, cfg: Config, store: JobStore, backend: SlurmBackend,
        outcome: Outcome, *, spawn: Spawner | None = None) -> None:
    """Record the decision (and a suspect checkpoint, a requeue Slurm made) and requeue."""
    from wrapper.restart import apply

    if outcome.external is not None:
        store.record(outcome.external)
    if outcome.fallback is not None:
        apply.record_suspect(store, ctx, outcome.verdict, outcome.gathered)
    apply.record(store, ctx, outcome.verdict, outcome.decision, outcome.gathered)
    if outcome.decision.requeue:
        apply.requeue(ctx, cfg, store, backend, outcome.decision, spawn=spawn,
                      already_requeued=outcome.external is not None)
