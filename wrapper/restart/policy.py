"""The restart policy: requeue when a retry can help, stop when it cannot, say why.

Rules, in order: never after success or a cancel, never with --no-requeue; never past
--max-restarts (the crash-loop limit); never for a class that retrying cannot fix
(CUDA out of memory); not when the same user-code error repeats; not when the last
attempts made no checkpoint progress (faults that are not the job's own, such as a
GPU fault or a node failure, do not count against it). A hardware fault also drains
the node (done by the post-job check) and excludes it for this job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wrapper.restart.classify import (
    CANCELLED,
    HARDWARE,
    NODE_FAILURE,
    NOT_THE_JOBS_FAULT,
    SUCCESS,
    USER_ERROR,
    Classification,
)


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
           checkpoint_path: str | None, node: str, no_progress_limit: int = 2) -> Decision:
    """Decide for the attempt that just ended (``attempt``: 0 for the first run)."""
    if now.kind == SUCCESS:
        return Decision("done", "the job succeeded")
    if now.kind == CANCELLED:
        return Decision("stop", "the job was cancelled; jobwrap does not requeue a cancel")
    if no_requeue:
        return Decision("stop", f"{now.kind}: not requeued (--no-requeue)")
    if not now.retryable:
        return Decision("stop", f"{now.kind}: a retry would fail the same way ({now.detail})")
    if attempt >= max_restarts:
        return Decision("stop", f"{now.kind}: restart limit reached ({attempt} of "
                        f"--max-restarts={max_restarts}); fix the cause and resubmit")
    previous = history[-1] if history else None
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
    exclude = [node] if now.kind in (HARDWARE, NODE_FAILURE) and node else []
    resume = f"; resumes from {checkpoint_path}" if checkpoint_path else \
        "; no valid checkpoint yet, starts from the beginning"
    return Decision("requeue", f"{now.kind} ({now.detail}): requeued as attempt "
                    f"{attempt + 1} of at most {max_restarts}{resume}", exclude)


def _no_progress(attempts: list[PastAttempt]) -> bool:
    steps = [a.checkpoint_step for a in attempts]
    return len(set(steps)) == 1
