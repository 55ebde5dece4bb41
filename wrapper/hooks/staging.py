"""The hooks' side of staging (``stage_job_in``, ``stage_job_out``, ``remove_job_scratch``:
one job's, over ``wrapper.staging``'s ``stage_in``, ``stage_out``, ``remove_scratch``):
per-job scratch, stage-in in the prolog, stage-out and cleanup in the epilog, each
recorded in the per-job state.

A stage-in that fails is the job's problem (a source it cannot read, a dataset too big
for the node): it is recorded, the node stays in service, and the job's batch step is
refused by the task-prolog with the message in the job's own output.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from wrapper import log
from wrapper.config import Config
from wrapper.errors import JobwrapError
from wrapper.job import events as ev
from wrapper.job.paths import JobPaths
from wrapper.job.record import JobRecord
from wrapper.job.state import JobState
from wrapper.job.store import JobStore
from wrapper.slurm.context import JobContext

if TYPE_CHECKING:
    from wrapper.osl.users import UserIds
    from wrapper.staging import Progress, StageReport

PROGRESS_EVERY = 5.0  # seconds between two progress lines of one directive


def _user(record: JobRecord) -> UserIds:
    from wrapper.osl.users import UserIds

    return UserIds.for_job(record.user, record.uid, record.gid)


def _progress(direction: str) -> Callable[[Progress], None]:
    last: dict[str, float] = {}
    logger = log.get()

    def report(update: Progress) -> None:
        now = time.monotonic()
        if update.done or now - last.get(update.directive, 0.0) >= PROGRESS_EVERY:
            last[update.directive] = now
            logger.info(f"staging.{direction}.progress", directive=update.directive,
                        files=update.files_done, files_total=update.files_total,
                        bytes=update.bytes_done, bytes_total=update.bytes_total,
                        mib_per_s=round(update.rate / 2**20, 1), done=update.done)

    return report


def stage_job_in(ctx: JobContext, cfg: Config, state: JobState, record: JobRecord, *,
             deadline: float) -> None:
    """Make the job's scratch on this node and stage its --stage-in directives into it."""
    from wrapper.staging.scratch import prepare_scratch

    user = _user(record)
    scratch = prepare_scratch(Path(cfg.paths.scratch_root), ctx.job_id, user)
    directives = record.job_options.stage_in
    if not directives or record.options_error:
        return
    # The copy engine and the cache only for a job that stages something.
    from wrapper.staging import Cache, StageSettings, StagingError, parse_stage_in, stage_in

    def attempt(cache: Cache | None) -> StageReport:
        return stage_in([parse_stage_in(d) for d in directives], scratch=scratch, user=user,
                       cache=cache, settings=StageSettings.from_config(cfg.staging),
                       progress=_progress("in"), work_dir=record.work_dir,
                       timeout=max(1.0, deadline - time.monotonic()))

    try:
        cache = Cache.from_config(cfg.paths.cache_root, cfg.staging)
        try:
            report = attempt(cache)
        except StagingError as exc:
            if cache is None:
                raise
            # The node's cache is the site's problem, not the job's: stage without it.
            log.get().error("staging.cache_unusable", error=str(exc))
            JobStore(state).record(ev.StagingCacheUnusable(
                attempt=ctx.attempt, node=ctx.node, error=str(exc)))
            report = attempt(None)
    except JobwrapError as exc:
        log.get().warning("staging.in_failed", error=str(exc))
        JobStore(state).record(ev.StagingFailed(attempt=ctx.attempt, node=ctx.node,
                                                direction="in", error=str(exc)))
        return
    _record(ctx, cfg, state, "in", report)


def stage_job_out(ctx: JobContext, cfg: Config, state: JobState, record: JobRecord, *,
              deadline: float) -> list[str]:
    """Copy the job's --stage-out directives back, whatever the job's outcome.

    Returns what did not come back (empty: everything did, or there was nothing to
    stage); the caller then keeps the scratch (``keep_results``) instead of removing it.
    A directive whose SRC the job never made is no problem: there is nothing to keep.
    """
    from wrapper.staging import StageSettings, parse_stage_out, stage_out

    directives = record.job_options.stage_out
    scratch = JobPaths.of(cfg, ctx.job_id).scratch
    if not directives or record.options_error or not scratch.is_dir():
        return []
    try:
        report = stage_out([parse_stage_out(d) for d in directives], scratch=scratch,
                          user=_user(record), settings=StageSettings.from_config(cfg.staging),
                          progress=_progress("out"), work_dir=record.work_dir,
                          timeout=max(1.0, deadline - time.monotonic()))
    except JobwrapError as exc:
        log.get().error("staging.out_failed", error=str(exc))
        JobStore(state).record(ev.StagingFailed(attempt=ctx.attempt, node=ctx.node,
                                                direction="out", error=str(exc)))
        return [str(exc)]
    _record(ctx, cfg, state, "out", report)
    problems = [p for item in report.items for p in item.problems]
    if problems:
        log.get().error("staging.out_incomplete", problems=problems[:10], count=len(problems))
    return problems


def keep_results(ctx: JobContext, cfg: Config, state: JobState, record: JobRecord,
                 problems: list[str]) -> None:
    """Keep this node's scratch of the job in quarantine, and tell the user where.

    A stage-out that did not bring everything back must not lose the rest: the scratch
    is moved (root's folder, the user's results, mode 0700) and kept for
    ``[staging] kept_results_days``; the job's output says what did not come back, why,
    where the results are and until when; a root event records it.
    """
    from wrapper.staging.scratch import quarantine_scratch

    kept = quarantine_scratch(Path(cfg.paths.scratch_root), ctx.job_id,
                              f"attempt{ctx.attempt}")
    if kept is None:  # no scratch folder left to keep
        remove_job_scratch(ctx, cfg, state)
        return
    until = time.time() + cfg.staging.kept_results_days * 86400
    shown_until = time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(until))
    JobStore(state).record(ev.StagingKept(attempt=ctx.attempt, node=ctx.node, path=str(kept),
                                          until=round(until), problems=problems[:20]))
    log.get().error("staging.results_kept", path=str(kept), until=shown_until,
                    problems=problems[:10])
    from wrapper.job.output import tell

    why = "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)"
                                     if len(problems) > 3 else "")
    message = (f"jobwrap: stage-out did not bring back all results of attempt {ctx.attempt}: "
               f"{why}. Nothing was deleted: everything the job left in its scratch is kept "
               f"on node {ctx.node} in {kept} (readable by you and root only) until "
               f"{shown_until}; copy it from there (e.g. srun -w {ctx.node} ...) before then.")
    tell(record.stdout, _user(record), message, event="staging.kept_untold")


def prune_kept(cfg: Config) -> None:
    """Remove kept scratch folders past their retention (never fails the hook)."""
    from wrapper.staging.scratch import prune_quarantine

    try:
        removed = prune_quarantine(Path(cfg.paths.scratch_root),
                                   cfg.staging.kept_results_days * 86400, time.time())
    except (JobwrapError, OSError) as exc:
        log.get().error("staging.prune_failed", error=str(exc))
        return
    if removed:
        log.get().info("staging.kept_pruned", jobs=removed)


def settle_cache(cfg: Config, record: JobRecord) -> None:
    """Make the node cache's entries of this boot durable (one syncfs), off the start
    path: the stage-in wrote them complete but not yet on disk (``Cache.settle``). Only
    after a job that staged in; never fails the hook."""
    if not record.job_options.stage_in or record.options_error or not cfg.staging.cache:
        return
    from wrapper.staging import Cache

    started = time.monotonic()
    try:
        cache = Cache.from_config(cfg.paths.cache_root, cfg.staging)
        if cache is None:
            return
        try:
            settled = cache.settle()
        finally:
            cache.close()
    except (JobwrapError, OSError) as exc:
        log.get().error("staging.cache_unsettled", error=str(exc)[:300])
        return
    if settled:
        log.get().info("staging.cache_settled", entries=settled,
                       seconds=round(time.monotonic() - started, 3))


def remove_job_scratch(ctx: JobContext, cfg: Config, state: JobState) -> None:
    """Remove this node's scratch of the job, never following a link out of it."""
    from wrapper.staging import remove_scratch

    scratch = JobPaths.of(cfg, ctx.job_id).scratch
    if not scratch.exists() and not scratch.is_symlink():
        return
    removal = remove_scratch(scratch)
    JobStore(state).record(ev.ScratchRemoved(
        attempt=ctx.attempt, node=ctx.node, files=removal.files, dirs=removal.dirs,
        left=removal.left, complete=removal.complete))


def _record(ctx: JobContext, cfg: Config, state: JobState, direction: str,
            report: StageReport) -> None:
    hits = sum(1 for i in report.items if i.cache_hit)
    misses = sum(1 for i in report.items if i.cache_hit is False)
    done = ev.StagingIn if direction == "in" else ev.StagingOut
    JobStore(state).record(done(attempt=ctx.attempt, node=ctx.node, cache_hits=hits,
                                extra=report.as_dict()))
    log.get().info(f"staging.{direction}.done", files=report.files, bytes=report.bytes,
                   seconds=round(report.seconds, 3), cache_hits=hits, missing=report.missing)
    if cfg.metrics.textfile:
        from wrapper import metrics

        metrics.record_staging(cfg.metrics, direction=direction, bytes_copied=report.bytes,
                               files=report.files, cache_hits=hits, cache_misses=misses,
                               node=ctx.node)
