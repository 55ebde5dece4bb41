"""A requeue jobwrap did not decide: the job's own, an admin's, or Slurm's.

PyTorch Lightning's ``SLURMEnvironment(auto_requeue=True)`` traps the signal the job asked
for (``#SBATCH --signal=USR1@90``), saves a checkpoint and runs ``scontrol requeue
$SLURM_JOB_ID`` itself; an admin may requeue a job; Slurm requeues a batch job after a
node failure. Each time Slurm's ``Restarts`` moves past the attempt that just ended before
the first node's epilog decides anything, and a second requeue by jobwrap would then
either fail (the job is already pending) or, once the requeued attempt runs, kill it.

Slurm counts such a requeue at once: the epilog's ``SLURM_JOB_RESTART_COUNT`` is already the
*next* attempt's number. ``ended_attempt`` puts back the number of the attempt that ran
here: the one root's prolog record on this node opened and no epilog here has closed.
Slurm's count stands when this node has no open attempt: slurmd sometimes skips the
Prolog of a requeued job back on a node within seconds (its credential cache already
holds the job id; seen in CI on 22.05 for a 2-node job whose first node was reused), so
the absence of a prolog record for the count is no sign of a requeue.

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
    """``ctx`` with the number of the attempt that ran on this node: Slurm's count, unless
    it is past the attempt root's prolog opened here and no epilog here has closed yet
    (a requeue made while the job ran, or a late end message)."""
    here = [e for e in store.root_events() if e.node == ctx.node]
    prologs = {e.attempt for e in here if isinstance(e, ev.PrologContext)}
    epilogs = {e.attempt for e in here if isinstance(e, ev.EpilogContext)}
    open_here = prologs - epilogs
    if ctx.attempt in prologs or not open_here:
        return ctx  # a skipped Prolog here is the epilog's to record (AttemptUnchecked)
    return replace(ctx, attempt=max(open_here))


def requeued_without_jobwrap(attempt: int, job: SlurmJob) -> bool:
    """Slurm's ``Restarts`` already counts a requeue after ``attempt`` (jobwrap's own
    requeue of it comes later, from this very decision)."""
    return job.restarts > attempt


def hold_back(decision: Decision, verdict: Classification, *, attempt: int, node: str,
              job: SlurmJob, saved: str | None = None, max_restarts: int | None = None,
              spent: int | None = None
              ) -> tuple[Decision, ev.RequeuedWithoutJobwrap | None]:
    """``decision`` unchanged, or, when the job was requeued without jobwrap, a
    ``requeue`` decision whose reason says so (the caller must not ask Slurm again) and
    the root event to record. ``saved``: the checkpoint after which the supervisor says
    it requeued the job before its time limit (its word: only the wording follows it).

    ``max_restarts`` (the job's limit, ``directives.allowed_restarts``) and ``spent``
    (the restarts attempt ``attempt`` spent, ``policy.restarts_spent``; else its
    number): a requeue that put the job past its limit is recorded but answered with a
    stop, which starts no release. The job's own ``scontrol requeue`` is no way past the
    limit that jobwrap's requeue keeps to: released, it would start at once, and again
    each time it requeues itself."""
    if not requeued_without_jobwrap(attempt, job):
        return decision, None
    restart = (attempt if spent is None else spent) + job.restarts - attempt
    if max_restarts is not None and restart > max_restarts:
        reason = (f"the job was requeued without jobwrap (Slurm's Restarts is "
                  f"{job.restarts} after attempt {attempt}: by the job itself, an admin, "
                  f"or Slurm), past its restart limit (restart {restart} of at most "
                  f"--max-restarts={max_restarts}); jobwrap does not release it")
        decision = Decision("stop", reason)
    elif saved is not None:
        reason = (f"requeued before its time limit by jobwrap's supervisor once the "
                  f"checkpoint it asked for was saved ({saved or 'unnamed'}; Slurm's "
                  f"Restarts is {job.restarts}); jobwrap does not requeue it again")
        decision = replace(decision, action="requeue", reason=reason)
    else:
        reason = (f"the job was requeued without jobwrap (Slurm's Restarts is "
                  f"{job.restarts} after attempt {attempt}: by the job itself, as "
                  f"Lightning's auto-requeue does, an admin, or Slurm); jobwrap does not "
                  f"requeue it again")
        decision = replace(decision, action="requeue", reason=reason)
    event = ev.RequeuedWithoutJobwrap(attempt=attempt, node=node, restarts=job.restarts,
                                      slurm_state=job.state, kind=verdict.kind,
                                      reason=reason)
    return decision, event
