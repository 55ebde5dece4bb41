"""The restart policy: requeue when a retry can help, stop when it cannot, say why.

Rules, in order: never after success or a cancel, never with --no-requeue; never past
--max-restarts (the crash-loop limit); never for a class that retrying cannot fix
(CUDA out of memory); not when the same user-code error repeats; not when the last
attempts made no checkpoint progress (faults that are not the job's own, such as a
GPU fault, a node failure or a prolog Slurm skipped, do not count against it). A
hardware fault also drains the node (done by the post-job check) and excludes it for
this job; a node that skipped the prolog is excluded too, not drained.

Falling back: an attempt that resumed from checkpoint C and failed by the job's own
kind of failure (``FALLBACK_KINDS``) before a newer checkpoint appeared makes C suspect
(``suspect``); when an older valid checkpoint exists the job is requeued to resume from
it, before the same-error and no-progress rules may stop it (the restart limit and
--no-requeue still hold).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field

from wrapper.fastdataclass import dataclass
from wrapper.restart.classify import (
    CANCELLED,
    CLAIMED_SKIP,
    HARDWARE,
    HOST_OOM,
    NODE_FAILURE,
    NOT_THE_JOBS_FAULT,
    SUCCESS,
    UNCHECKED,
    USER_ERROR,
    Classification,
)

# The failures that say the job's code or data failed (a bad checkpoint can crash the
# resume or exhaust memory loading it); not hardware, preemption, a kill or a timeout.
FALLBACK_KINDS = frozenset({USER_ERROR, HOST_OOM})


def suspect(now: Classification, *, resumed_from: str | None,
            checkpoint_path: str | None) -> bool:
    """The checkpoint this attempt resumed from is suspect: it failed by its own kind of
    failure and the latest valid checkpoint is still the one it resumed from."""
    return (now.kind in FALLBACK_KINDS and resumed_from is not None
            and checkpoint_path == resumed_from)


@dataclass(frozen=True)
class PastAttempt:
    attempt: int
    kind: str
    signature: str
    checkpoint_step: int | None
    checkpoint_path: str | None = None


@dataclass(frozen=True)
class Decision:
    action: str  # "requeue" | "stop" | "done"
    reason: str
    exclude_nodes: list[str] = field(default_factory=list)

    @property
    def requeue(self) -> bool:
        return self.action == "requeue"


def decide(now: Classification, *, attempt: int, max_restarts: int, no_requeue: bool,
           history: list[PastAttempt], checkpoint_step: int | None,
           checkpoint_path: str | None, node: str, no_progress_limit: int = 2,
           fallback: tuple[str, str] | None = None, asked: int | None = None) -> Decision:
    """Decide for the attempt that just ended (``attempt``: 0 for the first run).

    ``fallback``: (the suspect checkpoint, the older one to resume from) when ``suspect``
    holds and an older valid checkpoint exists. ``asked``: the job's own --max-restarts
    when the site's limit lowered it to ``max_restarts`` (said when the limit stops it)."""
    if now.kind == SUCCESS:
        return Decision("done", "the job succeeded")
    if now.kind == CANCELLED:
        return Decision("stop", "the job was cancelled; jobwrap does not requeue a cancel")
    if no_requeue:
        return Decision("stop", f"{now.kind}: not requeued (--no-requeue)")
    if not now.retryable:
        return Decision("stop", f"{now.kind}: a retry would fail the same way ({now.detail})")
    # An attempt Slurm ran without jobwrap's prolog never ran the job's code: on root's
    # record of the skip it spends none of the job's restarts (at most max_restarts of its
    # own, so a loop still ends); on the task-prolog's word from another node
    # (CLAIMED_SKIP: the job's word) it spends one, as any restart does.
    skipped = sum(1 for h in history if _free_skip(h.kind, h.signature))
    free = _free_skip(now.kind, now.signature)
    if free and skipped + 1 > max_restarts:
        return Decision("stop", f"{now.kind}: Slurm skipped jobwrap's prolog {skipped + 1} "
                        f"times (at most --max-restarts={max_restarts}); upgrade Slurm to "
                        "23.02 or later and resubmit")
    ran = restarts_spent(now, attempt=attempt, history=history)
    if not free and ran >= max_restarts:
        site = f"; the job asked for {asked}, this cluster allows at most {max_restarts}" \
            if asked is not None and asked > max_restarts else ""
        return Decision("stop", f"{now.kind}: restart limit reached ({ran} of "
                        f"--max-restarts={max_restarts}{site}); fix the cause and resubmit")
    if fallback is not None:
        bad, older = fallback
        return Decision("requeue", f"{now.kind} ({now.detail}) right after resuming from "
                        f"{bad}: that checkpoint is suspect; requeued as attempt "
                        f"{attempt + 1}, restart {ran + 1} of at most {max_restarts}; "
                        f"falls back to {older}")
    ran_before = [h for h in history if h.kind != UNCHECKED]
    previous = ran_before[-1] if ran_before else None
    if (now.kind == USER_ERROR and previous is not None and previous.kind == USER_ERROR
            and previous.signature == now.signature):
        return Decision("stop", f"the same error ended attempts {previous.attempt} and "
                        f"{attempt} ({now.detail}); a retry cannot help")
    if now.kind not in NOT_THE_JOBS_FAULT:
        counted = [h for h in history if h.kind not in NOT_THE_JOBS_FAULT]
        recent = [*counted[-(no_progress_limit - 1):], PastAttempt(
            attempt, now.kind, now.signature, checkpoint_step)] if no_progress_limit > 1 else []
        if len(recent) >= no_progress_limit and _no_progress(recent):
            return Decision("stop", f"no checkpoint progress in the last {len(recent)} "
                            f"attempts (latest step {checkpoint_step}); a retry cannot help")
    # Away from a node that failed, and from one whose slurmd skipped the prolog: it may
    # skip it again as long as its credential cache holds the job.
    exclude = [node] if now.kind in (HARDWARE, NODE_FAILURE, UNCHECKED) and node else []
    resume = f"; resumes from {checkpoint_path}" if checkpoint_path else \
        "; no valid checkpoint yet, starts from the beginning"
    limit = f"{attempt + 1} of at most {max_restarts}" if ran == attempt else \
        f"{attempt + 1}, restart {ran + 1} of at most {max_restarts}" if not free \
        else f"{attempt + 1} (no restart of the job's: its code did not run)"
    return Decision("requeue", f"{now.kind} ({now.detail}): requeued as attempt "
                    f"{limit}{resume}", exclude)


def restarts_spent(now: Classification, *, attempt: int,
                   history: Sequence[PastAttempt]) -> int:
    """The job's restarts spent up to attempt ``attempt`` (``now`` its class), which the
    restart limit holds: its number, less the attempts root's record shows Slurm ran
    without jobwrap's prolog (their code never ran)."""
    skipped = sum(1 for h in history if _free_skip(h.kind, h.signature))
    return attempt - skipped - (1 if _free_skip(now.kind, now.signature) else 0)


def _free_skip(kind: str, signature: str) -> bool:
    """An attempt root's own record shows Slurm ran without jobwrap's prolog."""
    return kind == UNCHECKED and signature != CLAIMED_SKIP


def _no_progress(attempts: list[PastAttempt]) -> bool:
    steps = [a.checkpoint_step for a in attempts]
    return len(set(steps)) == 1
