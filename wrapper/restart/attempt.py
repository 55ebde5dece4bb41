"""The whole restart decision on an attempt's end, in one place: the first node's epilog
calls ``decide`` (gather the evidence and what the other nodes say, then the one judge:
``wrapper.restart.judge``); what follows a verdict is ``wrapper.hooks.aftermath.act``.

Which attempt ended is ``wrapper.restart.requeued.ended_attempt`` (the epilog asks it
first, before it records anything); the evidence is ``wrapper.restart.evidence``; the
other nodes' faults and losses ``wrapper.restart.remote``; the pure judgement
``wrapper.restart.judge`` (which ``jobwrap run`` calls too); the side effects
``wrapper.restart.apply``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wrapper.fastdataclass import dataclass
from wrapper.job import events as ev
from wrapper.restart.classify import Classification
from wrapper.restart.policy import Decision

if TYPE_CHECKING:
    from wrapper.config import Config
    from wrapper.job.record import JobRecord
    from wrapper.job.store import JobStore
    from wrapper.osl.users import UserIds
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
           confirm: GpuConfirmer | None = None, deadline: float | None = None) -> Outcome:
    """Classify the attempt that ended and decide what follows. It acts on nothing; the
    only record it makes is root's own GPU confirmation, when a reported fault needs one.

    ``gpu_check_failed``: root's post-job check on this node failed; ``gpu_checked``: it
    ran (else a reported GPU fault is confirmed by a probe of root's own here).
    ``deadline``: the epilog's (``time.monotonic``), which asking Slurm's accounting for a
    lost node never runs past (``remote.lost_nodes``)."""
    from wrapper.osl.users import UserIds
    from wrapper.restart import evidence, remote
    from wrapper.restart.classify import classify
    from wrapper.restart.judge import Facts, judge
    from wrapper.submit.directives import allowed_restarts

    user = UserIds.of(record.uid, record.gid)
    gathered = evidence.gather(ctx, cfg, store, record, backend, user,
                               gpu_check_failed=gpu_check_failed, gpu_checked=gpu_checked,
                               confirm=confirm)
    # What the other nodes say, asked only where it can change this node's class
    others = remote.gather(backend, ctx, store.root_events(), gathered.info,
                           classify(gathered.evidence).kind, deadline=deadline)
    options, checkpoint = record.job_options, gathered.checkpoint
    saved = next((e for e in store.events() if isinstance(e, ev.WalltimeRequeued)
                  and e.attempt == ctx.attempt), None)  # the supervisor's word: wording only
    stopped = next((e for e in reversed(store.user_claims(ctx.attempt))
                    if isinstance(e, ev.RunStopped)), None)
    judgement = judge(Facts(
        evidence=gathered.evidence, attempt=ctx.attempt,
        max_restarts=allowed_restarts(options, cfg), asked=options.max_restarts,
        # sbatch --no-requeue (or a site's job_submit): Slurm would refuse.
        no_requeue=options.no_requeue or not gathered.job.requeue_allowed,
        history=gathered.history, checkpoint_step=checkpoint.step if checkpoint else None,
        checkpoint_path=checkpoint.path if checkpoint else None,
        resumed_from=gathered.resumed.path if gathered.resumed else None,
        older_valid=gathered.older.path if gathered.older else None,
        node=ctx.node, no_progress_limit=cfg.restart.no_progress_limit, remote=others,
        nodes=len(ctx.nodes), run_stopped=stopped, job=gathered.job,
        saved=saved.checkpoint or "" if saved else None))
    return Outcome(judgement.verdict, judgement.decision, gathered, judgement.external,
                   judgement.fallback, user)
