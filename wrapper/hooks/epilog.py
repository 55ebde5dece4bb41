"""The epilog (root, every allocated node): record the end, and on the job's first node
classify the attempt's outcome and requeue it when a retry can help.

Everything read from the user's files (the output's tail, the checkpoints) is read with
the user's rights, and decides nothing by itself: control flow follows root's own
events and the supervisor's root-owned channel (``wrapper.job.facts``); a GPU fault anyone
reports is hardware only once root's probe confirms it. A stage-out that did not bring
everything back keeps the scratch in quarantine instead of removing it.

This module keeps only the order of things: which attempt ended and the decision are
``wrapper.restart`` (``requeued.ended_attempt``, ``attempt.decide``), what follows the
decision ``wrapper.hooks.aftermath.act``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from wrapper import log
from wrapper.config import Config
from wrapper.errors import EXIT_OK, FormatTooNew, JobwrapError
from wrapper.job import events as ev
from wrapper.job import record as jobrecord
from wrapper.job import state as state_mod
from wrapper.job.store import JobStore
from wrapper.restart.policy import Decision
from wrapper.slurm.context import JobContext

if TYPE_CHECKING:
    from wrapper.hooks.services import Services
    from wrapper.slurm import SlurmBackend


def run(ctx: JobContext, cfg: Config, out: TextIO, env: Mapping[str, str] | None = None,
        services: Services | None = None) -> int:
    if services is None:
        from wrapper.hooks.services import Services

        services = Services(cfg)
    started = time.monotonic()
    logger = log.get()
    state = state_mod.for_job(cfg, ctx.job_id)
    store = JobStore(state)
    # The prolog normally made the directory; an epilog after a failed prolog must not fail.
    state.prepare(ctx.uid, ctx.gid)
    from wrapper.restart.requeued import ended_attempt

    ctx = ended_attempt(ctx, store)  # Slurm counts a requeue the job made itself at once
    store.record(ev.EpilogContext(node=ctx.node, hook=ctx.hook, attempt=ctx.attempt,
                                  context=ctx.as_dict()))
    from wrapper.watch import process as watch

    watch.stop(state, ctx.node)  # this node's fault feed: the job has ended
    gpu_check_failed = False
    gpu_checked = False
    backend = services.slurm
    if cfg.checks.epilog:
        from wrapper.hooks.health import check_node, unchecked

        # A failed post-job check drains this node with its reason; the epilog itself
        # exits 0 so that Slurm does not replace that reason with "Epilog error".
        try:
            report = check_node(ctx, cfg, env or {}, phase="epilog", backend=backend,
                                state=state, services=services)
            gpu_check_failed, gpu_checked = report.verdict == "fail", True
        except JobwrapError as exc:
            unchecked(cfg, state, ctx, exc)
    # After a failed prolog Slurm has already counted the restart, so the attempt numbers
    # differ: what tells is that this node's last prolog event (root's) is the failure.
    if store.prolog_failed_here(ctx.node):
        # The job never started: Slurm requeues it after the failed prolog by itself.
        logger.info("epilog.after_failed_prolog")
        return EXIT_OK
    prolog_here = store.prolog_ran(ctx.node, ctx.attempt)
    if not prolog_here:
        _unchecked_here(ctx, cfg, store, services)
    try:
        record = jobrecord.load(state)
    except FormatTooNew:
        raise  # a newer jobwrap's job: refused, never decided on half of what it wrote
    except JobwrapError:
        record = jobrecord.gather(ctx, backend)
    deadline = started + cfg.hooks.epilog_budget
    info: dict[str, str] = {}
    if ctx.first_node and not _released(ctx, record, store, backend):
        if ctx.attempt > 0:  # root's verdicts on earlier attempts: those this attempt's
            # prolog could not read (it was skipped, or an epilog of a node Slurm lost
            # archived them late); what it copied already is not copied again
            from wrapper.archive.carry import earlier_verdicts

            earlier_verdicts(cfg, store, job_id=ctx.job_id, user=ctx.user,
                             attempt=ctx.attempt)
        _decision, info = decide_attempt(ctx, cfg, state, record, backend,
                                         gpu_check_failed=gpu_check_failed,
                                         gpu_checked=gpu_checked, services=services,
                                         deadline=deadline)
    from wrapper.hooks import staging

    not_back: list[str] = []
    try:  # outputs first: a failed job's partial results are not lost
        not_back = staging.stage_job_out(ctx, cfg, state, record, deadline=deadline)
    except JobwrapError as exc:
        log.get().error("epilog.stage_out_broken", error=str(exc))
        not_back = [str(exc)]
    if cfg.archive.enabled:
        _archive(ctx, cfg, store, record, backend, info)
    try:  # only once the archive is complete; what did not come back is kept
        if not_back:
            staging.keep_results(ctx, cfg, state, record, not_back)
        else:
            staging.remove_job_scratch(ctx, cfg, state)
    except JobwrapError as exc:
        log.get().error("epilog.scratch_not_removed", error=str(exc))
    staging.prune_kept(cfg)
    staging.settle_cache(cfg, record)
    _prune_user_files(cfg)
    logger.info("epilog.done", exit_code=ctx.exit_code, exit_signal=ctx.exit_signal)
    return EXIT_OK


def _released(ctx: JobContext, record: jobrecord.JobRecord, store: JobStore,
              backend: SlurmBackend) -> bool:
    """Whether this epilog is for a node the job gave back or lost (``jobwrap run`` moving
    the work onto a spare: ``scontrol update JobId= NodeList=``; a node Slurm excised
    under ``--no-kill`` that comes back), not the job's end on its first node: Slurm names
    this node alone while root's record of this attempt (this node's prolog ran for it)
    has more, and the node was not the attempt's first, or the job still runs. Then the
    node's own work is done (its check, its scratch) and no decision is made here."""
    if ctx.nodes != [ctx.node] or len(record.nodes) < 2 or ctx.node not in record.nodes \
            or not store.prolog_ran(ctx.node, ctx.attempt):
        return False
    if record.first_node != ctx.node:
        log.get().info("epilog.node_released", nodes=",".join(record.nodes))
        return True
    try:
        running = backend.job_state(ctx.job_id).split()[0] in ("RUNNING", "SUSPENDED")
    except (JobwrapError, IndexError):
        return False
    if running:
        log.get().info("epilog.node_released", nodes=",".join(record.nodes))
    return running


def _unchecked_here(ctx: JobContext, cfg: Config, store: JobStore,
                    services: Services) -> None:
    """Slurm ran no prolog here for the attempt (root's record has none): say so, and with
    ``unchecked_attempt = "requeue"`` keep the next attempt off this node. The first node's
    decision excludes it itself (class ``unchecked``); another node cannot reach that
    decision, so it starts a release that excludes it from whatever requeue follows (a
    job that is not requeued is left alone: the release acts on a PENDING job only)."""
    excluding = cfg.hooks.unchecked_attempt == "requeue" and not ctx.first_node
    reason = ev.prolog_skipped(ctx.node, ctx.attempt)
    log.get().warning("epilog.prolog_skipped", attempt=ctx.attempt, reason=reason,
                      action=cfg.hooks.unchecked_attempt)
    store.record(ev.AttemptUnchecked(attempt=ctx.attempt, node=ctx.node, reason=reason,
                                     excluded=excluding))
    if excluding:
        from wrapper import detach

        detach.start_release(ctx.job_id, cfg.source, [ctx.node], spawn_with=services.spawn)


def _archive(ctx: JobContext, cfg: Config, store: JobStore, record: jobrecord.JobRecord,
             backend: SlurmBackend, info: dict[str, str]) -> None:
    """This node's part of the attempt's archive; never fails the epilog."""
    from wrapper.archive import archive_attempt
    from wrapper.watch.forensics import forensics_of

    script = ""
    if ctx.first_node:
        kept = store.script()  # the prolog kept it: Slurm is asked only when it did not
        if kept is not None:
            script = kept
        else:
            try:
                script = backend.batch_script(ctx.job_id)
            except JobwrapError as exc:
                log.get().warning("epilog.script_unavailable", error=str(exc))
    from wrapper.restart.batch import unwrap

    result = archive_attempt(cfg, store.state, record, attempt=ctx.attempt, node=ctx.node,
                             script_text=unwrap(script), extra={"slurm": info,
                                                        **forensics_of(store.state, ctx.node)})
    store.record(ev.Archived(attempt=ctx.attempt, node=ctx.node, path=str(result.path),
                             complete=result.complete, files=len(result.files),
                             problems=[str(p) for p in result.problems],
                             seconds=round(result.elapsed_s, 3)))
    for problem in result.problems:
        log.get().warning("epilog.archive_problem", problem=str(problem))


def decide_attempt(ctx: JobContext, cfg: Config, state: state_mod.JobState,
                   record: jobrecord.JobRecord, backend: SlurmBackend, *,
                   gpu_check_failed: bool, gpu_checked: bool = True,
                   services: Services | None = None, deadline: float | None = None
                   ) -> tuple[Decision, dict[str, str]]:
    """Decide and act on the attempt's end (``wrapper.restart.attempt``), then tell the
    metrics, the goodput ledger and the job; returns the decision and Slurm's job record.

    ``gpu_check_failed``: root's post-job check on this node failed; ``gpu_checked``:
    it ran (else a reported GPU fault is confirmed by a probe of root's own here).
    ``deadline``: the epilog's budget's end (``time.monotonic``), which its waits for
    Slurm's accounting never pass.
    """
    from wrapper.hooks import aftermath
    from wrapper.restart import attempt

    store = JobStore(state)
    outcome = attempt.decide(ctx, cfg, store, record, backend,
                             gpu_check_failed=gpu_check_failed, gpu_checked=gpu_checked,
                             confirm=services.gpu_confirm if services else None,
                             deadline=deadline)
    aftermath.act(ctx, cfg, store, backend, record, outcome,
                  spawn=services.spawn if services else None)
    return outcome.decision, outcome.gathered.info


def _prune_user_files(cfg: Config) -> None:
    """Finished jobs' user-writable event files past their retention (never fails)."""
    from wrapper.job.state import prune_stale_user_files

    try:
        pruned = prune_stale_user_files(Path(cfg.paths.state_dir),
                                        cfg.hooks.user_events_days * 86400, time.time())
    except JobwrapError as exc:
        log.get().error("epilog.prune_failed", error=str(exc))
        return
    if pruned:
        log.get().info("epilog.user_files_pruned", jobs=pruned)
