"""A requeue jobwrap did not decide: the job's own, an admin's, or Slurm's.

PyTorch Lightning's ``SLURMEnvironment(auto_requeue=True)`` traps the signal the job asked
for (``#SBATCH --signal=USR1@90``), saves a checkpoint and runs ``scontrol requeue
$SLURM_JOB_ID`` itself; an admin may requeue a job; Slurm requeues a batch job after a
node failure. Each time Slurm's ``Restarts`` moves past the attempt that just ended before
the first node's epilog decides anything, and a second requeue by jobwrap would then
either fail (the job is already pending) or, once the requeued attempt runs, kill it.

Slurm counts such a requeue at once: the epilog's ``SLURM_JOB_RESTART_COUNT`` is already the
*next* attempt's number. It can also lag: slurmd builds the epilog's environment from the
job credential it is handed, and a node that ran the attempt before on the same node (or
an epilog run without a credential) sees the previous count, or none ("0"), seen in CI
on 22.05 as attempt 1's epilog saying attempt 0. ``ended_attempt`` therefore takes the
number of the attempt that ran here from root's own record of this node's last prolog
(Slurm starts no later attempt on a node before the earlier one's epilog there ends);
Slurm's count only where this node has no prolog record.

Then the first node's epilog reads Slurm's own ``Restarts`` (a field no user can write) and,
when it is past this attempt, records a ``requeue.external`` root event and does not
requeue: it only makes the job eligible at once (``jobwrap release``), as after its own
requeue, excluding a faulty node when one was found.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from wrapper.job import events as ev
from wrapper.restart.classify import Classification
from wrapper.restart.policy import Decision
from wrapper.slurm.records import SlurmJob

if TYPE_CHECKING:
    from wrapper.job.store import JobStore
    from wrapper.slurm.context import JobContext


def ended_attempt(ctx: JobContext, store: JobStore) -> JobContext:
    """``ctx`` with the number of the attempt that ran on this node: root's last prolog
    record here, whatever the count in the epilog's environment (ahead after a requeue
    made while the job ran, behind or missing where slurmd had a stale credential)."""
    ran = [e.attempt for e in store.root_events()
           if isinstance(e, ev.PrologContext) and e.node == ctx.node]
    if ran and ran[-1] != ctx.attempt:
        from wrapper import log

        log.get().info("epilog.attempt_from_prolog", slurm_count=ctx.attempt, ran=ran[-1])
        return replace(ctx, attempt=ran[-1])
    return ctx


def requeued_without_jobwrap(attempt: int, job: SlurmJob) -> bool:
    """Slurm's ``Restarts`` already counts a requeue after ``attempt`` (jobwrap's own
    requeue of it comes later, from this very decision)."""
    return job.restarts > attempt


def hold_back(decision: Decision, verdict: Classification, *, attempt: int, node: str,
              job: SlurmJob) -> tuple[Decision, ev.RequeuedWithoutJobwrap | None]:
    """``decision`` unchanged, or, when the job was requeued without jobwrap, a
    ``requeue`` decision whose reason says so (the caller must not ask Slurm again) and
    the root event to record."""
    if not requeued_without_jobwrap(attempt, job):
        return decision, None
    reason = (f"the job was requeued without jobwrap (Slurm's Restarts is {job.restarts} "
              f"after attempt {attempt}: by the job itself, as Lightning's auto-requeue does, "
              f"an admin, or Slurm); jobwrap does not requeue it again")
    event = ev.RequeuedWithoutJobwrap(attempt=attempt, node=node, restarts=job.restarts,
                                      slurm_state=job.state, kind=verdict.kind,
                                      reason=reason)
    return replace(decision, action="requeue", reason=reason), event
