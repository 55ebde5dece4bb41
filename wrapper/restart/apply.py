"""Acting on a restart decision: record it, requeue, release, and tell the job.

The requeue is made at once (so the decision survives anything that follows), and a
detached ``jobwrap release`` makes the job eligible as soon as Slurm has finished
completing it, instead of after Slurm's fixed 121 s requeue delay. What the job's user
reads is appended to the job's own output with the user's rights.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from wrapper import log
from wrapper.errors import JobwrapError
from wrapper.job import events as ev
from wrapper.restart.classify import (
    COLLECTIVE_TIMEOUT,
    HANG,
    KILLED,
    USER_ERROR,
    Classification,
)
from wrapper.restart.evidence import USER_IO_TIMEOUT, Gathered
from wrapper.restart.policy import Decision

if TYPE_CHECKING:
    from wrapper.config import Config
    from wrapper.job.record import JobRecord
    from wrapper.job.store import JobStore
    from wrapper.osl.users import UserIds
    from wrapper.slurm import SlurmBackend
    from wrapper.slurm.context import JobContext

# Starts ``jobwrap release JOBID [--exclude NODE]...`` detached (a fake records it in tests).
Spawner = Callable[[Sequence[str]], object]


def record(store: JobStore, ctx: JobContext, verdict: Classification, decision: Decision,
           gathered: Gathered) -> None:
    """Root's verdict on the attempt: what the next attempts' decisions read back."""
    checkpoint, evidence = gathered.checkpoint, gathered.evidence
    store.record(ev.AttemptEnd(
        attempt=ctx.attempt, node=ctx.node, kind=verdict.kind, detail=verdict.detail,
        signature=verdict.signature, exit_code=evidence.exit_code,
        exit_signal=evidence.exit_signal, slurm_state=evidence.slurm_state,
        checkpoint_path=checkpoint.path if checkpoint else None,
        checkpoint_step=checkpoint.step if checkpoint else None,
        decision=decision.action, reason=decision.reason, exclude=decision.exclude_nodes))
    log.get().info("epilog.decision", kind=verdict.kind, decision=decision.action,
                   reason=decision.reason)


def record_suspect(store: JobStore, ctx: JobContext, verdict: Classification,
                   gathered: Gathered) -> None:
    """Root's verdict that the checkpoint this attempt resumed from is suspect (before the
    attempt's end, so that the next attempt's prolog passes it over)."""
    bad, older = gathered.resumed, gathered.older
    if bad is None:
        return
    store.record(ev.CheckpointSuspect(
        attempt=ctx.attempt, node=ctx.node, path=bad.path, step=bad.step, mtime=bad.mtime,
        fallback=older.path if older else "",
        reason=f"attempt {ctx.attempt} resumed from it and failed ({verdict.kind}: "
               f"{verdict.detail}) before a newer checkpoint appeared"))
    log.get().warning("epilog.checkpoint_suspect", path=bad.path,
                      fallback=older.path if older else None)


def requeue(ctx: JobContext, cfg: Config, store: JobStore, backend: SlurmBackend,
            decision: Decision, spawn: Spawner | None = None,
            already_requeued: bool = False) -> bool:
    """Requeue the job and start its release; a refusal is recorded, never raised.
    ``already_requeued``: Slurm requeued it without jobwrap (``wrapper.restart.requeued``):
    only the release."""
    from wrapper import detach

    try:
        if not already_requeued:
            backend.requeue(ctx.job_id)
        detach.start_release(ctx.job_id, cfg.source, decision.exclude_nodes, spawn_with=spawn)
    except JobwrapError as exc:  # Slurm said no: record it, and go on with the epilog
        log.get().error("epilog.requeue_failed", error=str(exc))
        store.record(ev.RequeueFailed(attempt=ctx.attempt, node=ctx.node, error=str(exc)))
        return False
    return True


# What ``jobwrap run`` restarts inside the allocation as well as a requeue would: a rank
# killed or crashed, a collective that lost its peer, a hang (the supervisor then ends
# the job's steps only). (A node's fault wants other nodes: the queue's, or a spare's.)
IN_PLACE_KINDS = frozenset({KILLED, USER_ERROR, COLLECTIVE_TIMEOUT, HANG})


def in_place_hint(verdict: Classification, decision: Decision, *, used_run: bool) -> str:
    """What the job's output adds when a requeue gave the nodes back for a failure that
    ``jobwrap run`` would have restarted inside the allocation ("" otherwise)."""
    if not decision.requeue or used_run or verdict.kind not in IN_PLACE_KINDS:
        return ""
    where = " (a hang: when CMD runs its work in srun steps)" if verdict.kind == "hang" else ""
    return (" This restart goes through Slurm's queue and gives the job's nodes back; "
            "with `jobwrap run -- CMD` around the job's command in the batch script it "
            f"would restart inside the allocation, in seconds{where} (docs/recovery.md).")


def tell_the_job(ctx: JobContext, record: JobRecord, user: UserIds, verdict: Classification,
                 decision: Decision, hint: str = "") -> None:
    """One line in the job's own output: what ended the attempt and what happens next."""
    if decision.action == "done":
        return
    from wrapper.job.output import tell

    tell(record.stdout, user, f"jobwrap: attempt {ctx.attempt} ended: {verdict.kind} "
         f"({verdict.detail}). {'Requeued' if decision.requeue else 'Not requeued'}: "
         f"{decision.reason}{hint}", timeout=USER_IO_TIMEOUT)
