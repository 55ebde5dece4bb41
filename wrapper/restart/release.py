"""``jobwrap release JOBID``: make a requeued job eligible as soon as Slurm allows.

Slurm holds a requeued job for a fixed 121 s, and a StartTime set while the job is
still COMPLETING is overwritten by that delay. So this waits (detached from the
epilog) until the job is PENDING, then a little more, since slurmd refuses to launch a
job within the second its previous credential was revoked, and releases it. Nodes to
avoid are excluded as soon as the job is PENDING, before that wait: when two releases
run for one requeue (the first node's, and one from a node whose prolog Slurm skipped),
neither starts the job before both exclusions are in.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from wrapper import log
from wrapper.config import Config
from wrapper.errors import JobwrapError


def release(job_id: str, cfg: Config, exclude: list[str], *, timeout: float = 120,
            sleep: Callable[[float], None] = time.sleep, running_grace: float = 0.0) -> bool:
    """``running_grace``: seconds during which a job still shown RUNNING or CONFIGURING is
    waited for. The prolog starts this before it exits with its failure, so Slurm has not
    requeued the job yet; the epilog starts it after the job ended (no grace)."""
    from wrapper import slurm

    backend = slurm.backend(cfg.slurm)
    logger = log.get()
    start = time.monotonic()
    deadline = start + timeout
    while time.monotonic() < deadline:
        try:
            current = backend.job_state(job_id)
        except JobwrapError as exc:
            logger.warning("release.slurm_unreachable", error=str(exc))
            current = ""
        if current == "PENDING":
            try:
                if exclude:  # at once: before any other release of this requeue starts it
                    kept = set(exclude) - set(backend.exclude_nodes(job_id, exclude))
                    if kept:
                        # Excluding these too would leave the job unable to run. Slurm's
                        # own requeue delay (cred_expire + 1) then runs its course: a node
                        # whose prolog it skipped runs it again once its credential is gone.
                        logger.warning("release.exclude_capped", job_id=job_id,
                                       not_excluded=sorted(kept))
                        return False
                sleep(cfg.restart.release_delay)
                backend.release_now(job_id)
            except JobwrapError as exc:  # e.g. a host list no cluster has: say so, not crash
                logger.error("release.failed", job_id=job_id, exclude=exclude, error=str(exc))
                return False
            logger.info("release.done", job_id=job_id, exclude=exclude)
            return True
        waiting: tuple[str, ...] = ("COMPLETING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "")
        if time.monotonic() - start < running_grace:
            waiting += ("RUNNING", "CONFIGURING")
        if current not in waiting:
            logger.info("release.not_pending", job_id=job_id, state=current)
            return False
        sleep(0.2)
    logger.warning("release.timeout", job_id=job_id)
    return False
