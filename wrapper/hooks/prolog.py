"""The prolog (root, every allocated node): record the job, check the node, start the supervisor."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TextIO

from wrapper import log
from wrapper.config import Config
from wrapper.errors import EXIT_OK, EXIT_UNHEALTHY, JobwrapError
from wrapper.hooks.health import check_node, unchecked
from wrapper.job import events as ev
from wrapper.job import record as jobrecord
from wrapper.job import state as state_mod
from wrapper.job.paths import RECORD, USER_EVENTS
from wrapper.job.store import JobStore
from wrapper.slurm.context import JobContext

if TYPE_CHECKING:
    from wrapper.hooks.services import Services


def run(ctx: JobContext, cfg: Config, out: TextIO, env: Mapping[str, str],
        services: Services | None = None) -> int:
    started = time.monotonic()
    logger = log.get()
    state = state_mod.for_job(cfg, ctx.job_id)
    state.prepare(ctx.uid, ctx.gid, user_files=(USER_EVENTS,))
    store = JobStore(state)
    store.record(ev.PrologContext(node=ctx.node, hook=ctx.hook, attempt=ctx.attempt,
                                  context=ctx.as_dict()))
    if services is None:
        from wrapper.hooks.services import Services

        services = Services(cfg)
    backend = services.slurm
    backend.recall_abilities(cfg.paths.state_dir)  # a scontrol without --json, known
    gathered = jobrecord.gather_in_background(ctx, backend)
    if ctx.attempt > 0:  # root's verdicts on earlier attempts (made on other nodes), read
        from wrapper.archive.carry import earlier_verdicts  # while Slurm is being asked

        earlier_verdicts(cfg, store, job_id=ctx.job_id, user=ctx.user, attempt=ctx.attempt)
    if cfg.checks.prolog:

        try:
            report = check_node(ctx, cfg, env, phase="prolog", backend=backend, state=state,
                                services=services)
        except JobwrapError as exc:
            unchecked(cfg, state, ctx, exc)
        else:
            if report.verdict == "fail":
                # Non-zero makes Slurm requeue the job (with nohold_on_prolog_fail it is
                # not held); release lifts Slurm's requeue delay, away from this node.
                from wrapper import detach

                store.record(ev.PrologUnhealthy(attempt=ctx.attempt, node=ctx.node,
                                                reason=report.drain_reason()))
                _archive_refusal(ctx, cfg, state, gathered, started)
                # Slurm requeues the job only once this prolog has exited: until then
                # it is still RUNNING, which the release waits out.
                detach.start_release(ctx.job_id, cfg.source, [ctx.node], running_grace=30,
                                     spawn_with=services.spawn)
                return EXIT_UNHEALTHY
    record, script = gathered()
    backend.remember_abilities(cfg.paths.state_dir)
    state.write_json(RECORD, record.stored())
    from wrapper.slurm.context import known_script

    if known_script(ctx) is None:  # Extra's directive lines (the user's) are no script
        store.save_script(script)  # the epilog's archive reads it: Slurm is asked once
    if record.options_error:
        # The user's mistake: say so where they look, never hold the node responsible.
        logger.warning("prolog.bad_directives", error=record.options_error)
        store.record(ev.DirectivesInvalid(attempt=ctx.attempt, node=ctx.node,
                                          error=record.options_error))
    # Scratch and stage-in before the supervisor: staging time is not the job's idle time.
    from wrapper.hooks import staging

    try:
        staging.stage_job_in(ctx, cfg, state, record, deadline=started + cfg.hooks.prolog_budget)
    except JobwrapError as exc:  # no scratch root, say: the site's setup, not the node
        unchecked(cfg, state, ctx, exc, what=ev.ScratchUnavailable)
    if ctx.first_node and not record.options_error:
        from wrapper.restart.resume import choose

        choose(store, record, attempt=ctx.attempt, node=ctx.node)
    if ctx.first_node and cfg.supervisor.enabled and record.uid > 0:
        from wrapper.supervisor.launch import start

        how = start(ctx.job_id, cfg)
        store.record(ev.SupervisorStarted(attempt=ctx.attempt, node=ctx.node, how=how))
    from wrapper.watch import process as watch

    watch.start(ctx, cfg, state, services.spawn)  # this node's root fault feed (wrapper/watch/)
    logger.info("prolog.done", gpus=ctx.gpus)
    return EXIT_OK


def _archive_refusal(ctx: JobContext, cfg: Config, state: state_mod.JobState,
                     gathered: Callable[[], tuple[jobrecord.JobRecord, str]],
                     started: float) -> None:
    """This node's part of the refused attempt in the job's archive, where the next
    attempt's nodes (most often others: this one is excluded) find root's word of it
    (``archive/carry``): each node keeps its state folder to itself, and Slurm may run no
    epilog here before the job starts again. Within what is left of the prolog's budget;
    never a failure of its own."""
    left = started + cfg.hooks.prolog_budget - time.monotonic() - 1.0
    if not cfg.archive.enabled or left < 1.0:
        return
    try:
        record, _script = gathered()
    except JobwrapError as exc:
        log.get().warning("prolog.refusal_not_archived", error=str(exc))
        return
    from wrapper.archive import archive_attempt

    budgeted = cfg.replace(archive=cfg.archive.replace(budget=min(cfg.archive.budget, left)))
    archive_attempt(budgeted, state, record, attempt=ctx.attempt, node=ctx.node,
                    script_text="", extra={})
