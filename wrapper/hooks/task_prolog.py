"""The task-prolog (job user, every task): export jobwrap's variables into the job.

Slurm reads ``export NAME=value`` lines from its stdout and puts them in the task's
environment (the value is taken literally, so it must hold no newline), and writes
``print TEXT`` lines to the task's output: the batch step's first task uses that to
tell the user, in their own output, why this attempt runs and what it resumes from.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TextIO

from wrapper import log
from wrapper.config import Config
from wrapper.errors import EXIT_OK, JobwrapError
from wrapper.job import events as ev
from wrapper.job import record as jobrecord
from wrapper.job import state as state_mod
from wrapper.job.paths import JobPaths
from wrapper.job.store import JobStore
from wrapper.restart import resume as resume_mod
from wrapper.slurm.context import JobContext
from wrapper.slurm.records import is_batch_step

if TYPE_CHECKING:
    from wrapper.hooks.services import Services


def exports(ctx: JobContext, cfg: Config, record: jobrecord.JobRecord | None,
            resume_from: str | None, environ: Mapping[str, str] | None = None
            ) -> dict[str, str]:
    scratch = str(JobPaths.of(cfg, ctx.job_id).scratch)
    values = resume_mod.exports(
        attempt=ctx.attempt, scratch=scratch,
        checkpoint_dir=record.checkpoint_dir if record is not None else None,
        resume_from=resume_from)
    from wrapper.config import DEFAULT_PATH, ENV_VAR
    from wrapper.watch import flight

    if os.path.isabs(cfg.source) and cfg.source != DEFAULT_PATH:
        # jobwrap run and status inside the job read the hooks' own config
        values[ENV_VAR] = cfg.source
    # PyTorch's flight recorder, for the hang forensics (the job's own values win)
    values.update(flight.exports(cfg.pulse.flight_recorder, scratch,
                                 os.environ if environ is None else environ))
    return values


def run(ctx: JobContext, cfg: Config, out: TextIO, env: Mapping[str, str] | None = None,
        services: Services | None = None) -> int:
    environ = os.environ if env is None else env
    state = state_mod.for_job(cfg, ctx.job_id)
    store = JobStore(state)
    record = None
    try:
        record = jobrecord.load(state)
    except JobwrapError as exc:
        log.get().warning("task-prolog.no_record", error=str(exc))
    events = store.root_events()  # decisions read root's record only, and read it once
    found = _resume_point(ctx, cfg, store, record, events, batch=_is_batch(environ))
    resume = found.path if found else None
    values = exports(ctx, cfg, record, resume, environ)
    _prepare_flight_folder(values)
    if resume_mod.under_run(environ) and not _is_batch(environ):
        # A step of a command jobwrap run restarted: it chose the attempt and the resume
        # point between two runs, when nothing was writing; a checkpoint saved seconds
        # before the restart is not yet settled here and must not be passed over.
        values.pop(resume_mod.ATTEMPT, None)
        values.pop(resume_mod.RESUME_FROM, None)
    # Export first: the job must get its variables even if what follows fails.
    for name, value in values.items():
        if "\n" not in value:
            out.write(f"export {name}={value}\n")
    if ctx.attempt > 0 and _is_batch(environ):
        out.write(f"print {_banner(ctx, store, found, events)}\n")
    refused = store.staging_refusal(ctx.node, ctx.attempt, events)
    if refused:
        # The job's data is not there: running it would only fail later, less clearly.
        out.write(f"print jobwrap: the job did not start: {refused}\n")
        out.flush()
        return 1
    if not store.prolog_ran(ctx.node, ctx.attempt, events):
        ends = cfg.hooks.unchecked_attempt == "requeue"
        log.get().warning("task-prolog.unchecked", node=ctx.node, attempt=ctx.attempt,
                          action=cfg.hooks.unchecked_attempt)
        out.write(f"print {unchecked_message(ctx, ends=ends)}\n")
        out.flush()
        if ends:  # before the job's code: a non-zero task-prolog ends the task unrun
            _end_step(ctx, cfg, environ, services)
            return 1
    out.flush()
    extra = {}
    if environ.get("SLURM_LOCALID", "0") == "0":  # once per node and step
        from wrapper.archive.jobenv import claims

        # Where the job's environment came from, for the manifest: the user's claims.
        extra["environment"] = claims(environ)
    try:
        _claim_under_run(ctx, store, environ)  # first: the capped user file keeps it
        store.record(ev.TaskPrologContext(
            node=ctx.node, hook=ctx.hook, attempt=ctx.attempt, uid=os.getuid(),
            step=environ.get("SLURM_STEP_ID", ""), task=environ.get("SLURM_PROCID", ""),
            context=ctx.as_dict(), exports=values, extra=extra))
    except JobwrapError as exc:
        log.get().warning("task-prolog.state_unavailable", error=str(exc))
    return EXIT_OK


def _prepare_flight_folder(values: Mapping[str, str]) -> None:
    """The folder the flight recorder dumps to, in the task's scratch (as the job's user:
    this hook runs as the user); a folder it cannot make only leaves the dumps unwritten."""
    from wrapper.watch.flight import dump_folder

    folder = dump_folder(values)
    if folder:
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            log.get().warning("task-prolog.flight_folder", path=folder, error=str(exc))


def _claim_under_run(ctx: JobContext, store: JobStore, environ: Mapping[str, str]) -> None:
    """A step of ``jobwrap run``'s command (its JOBWRAP_RUN came through srun) says so in
    this node's own folder, once per attempt: ``jobwrap run`` itself writes its
    ``run.started`` only on the batch node, and each node keeps its state to itself, so
    this is how a watcher here learns that a spare may take over from it. The user's
    word, as ``jobwrap run``'s own is (it decides only how the user's steps end)."""
    if not resume_mod.under_run(environ) or environ.get("SLURM_LOCALID", "0") != "0" \
            or store.under_run(ctx.attempt):
        return
    store.record(ev.RunStarted(attempt=ctx.attempt, node=ctx.node,
                               command="(a step of jobwrap run's command)"))


STEP_END_DELAY = 1.0  # seconds: slurmstepd forwards the task-prolog's print line first


def _end_step(ctx: JobContext, cfg: Config, environ: Mapping[str, str],
              services: Services | None) -> None:
    """End the whole step this task belongs to, with the job user's own right to cancel
    their step: its ranks on the other nodes would otherwise wait for this one in their
    rendezvous or first collective until a timeout (gloo's 30 min, or the hang floor), and
    the skip would be handled only then. Its tasks not yet started never start; the batch
    step is not a step of ranks (its task ending ends the script).

    The cancel is made from the background, STEP_END_DELAY after this task-prolog has
    returned: the line it printed is the first node's only word of the skip, and a step
    cancelled at once can lose it on its way to the job's output."""
    step = environ.get("SLURM_STEP_ID", "")
    if not step.isdigit():
        return
    if services is None:
        from wrapper.hooks.services import Services

        services = Services(cfg)
    backend_of = services

    def cancel() -> None:
        try:
            backend_of.slurm.cancel_step(ctx.job_id, step)
        except JobwrapError as exc:  # its ranks are then ended by a timeout, as before
            log.get().warning("task-prolog.step_not_ended", step=step, error=str(exc))

    _in_background(cancel, delay=STEP_END_DELAY)


def _in_background(work: Callable[[], None], *, delay: float) -> None:
    """Run ``work`` after ``delay`` in a child of its own session that holds none of this
    process's standard streams (slurmstepd reads the task-prolog's output to its end)."""
    if os.fork() != 0:
        return
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        time.sleep(delay)
        work()
    finally:
        os._exit(0)


def unchecked_message(ctx: JobContext, *, ends: bool) -> str:
    """What the job's output says when this node's prolog did not run for the attempt."""
    why = "so nothing checked this node's GPUs or staged the job's data here"
    if ends:  # the first node's epilog reads this line back (ev.claimed_unchecked)
        return (f"{ev.did_not_start(ctx.job_id, ctx.node, ctx.attempt)}, {why}; this attempt ends "
                f"before the job's code runs and is requeued away from {ctx.node} "
                f"([hooks] unchecked_attempt = \"requeue\")")
    return (f"jobwrap: warning: {ev.prolog_skipped(ctx.node, ctx.attempt)}, {why}; it runs "
            f"unchecked ([hooks] unchecked_attempt = \"run\")")


def _is_batch(env: Mapping[str, str]) -> bool:
    return is_batch_step(env.get("SLURM_STEP_ID", "batch")) and \
        env.get("SLURM_PROCID", "0") == "0"


def _resume_point(ctx: JobContext, cfg: Config, store: JobStore,
                  record: jobrecord.JobRecord | None, events: list[ev.Event],
                  batch: bool) -> resume_mod.Found | None:
    """Where this attempt resumes from (attempts >= 1): for the batch step, root's pick
    (``resume.chosen``); else the latest valid checkpoint read with this (the job user's)
    rights, suspects passed over."""
    if ctx.attempt < 1 or record is None or not record.checkpoint_dir:
        return None
    chosen = store.resumed_from(ctx.attempt, events) if batch else None
    if chosen is not None:
        return resume_mod.Found(chosen.path, chosen.step, mtime=chosen.mtime,
                                passed_over=tuple(chosen.passed_over))
    # Before the batch script runs nothing is writing; later steps may be mid-write.
    settle = 0.0 if batch else cfg.supervisor.settle_seconds
    suspects = [resume_mod.Suspect.of(e) for e in store.suspects(events)]
    return resume_mod.latest(record.checkpoint_dir, record.job_options,
                             settle_seconds=settle, suspects=suspects)


def _banner(ctx: JobContext, store: JobStore, found: resume_mod.Found | None,
            events: list[ev.Event]) -> str:
    end = store.last_end(events)
    why = ""
    if isinstance(end, ev.PrologUnhealthy):
        why = f" after node {end.node} failed its health check ({end.reason})"
    elif end is not None:
        why = f" after {end.kind} ({end.detail})"
    if found is None:
        where = "no valid checkpoint: starting from the beginning"
    else:
        step = f" (step {found.step})" if found.step is not None else ""
        where = f"resuming from {found.path}{step}"
        if found.passed_over:
            where = f"falling back past the suspect checkpoint " \
                    f"{', '.join(found.passed_over)}: {where}"
    return f"jobwrap: attempt {ctx.attempt}{why}; {where}"
