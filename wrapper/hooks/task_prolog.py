"""The task-prolog (job user, every task): export jobwrap's variables into the job.

Slurm reads ``export NAME=value`` lines from its stdout and puts them in the task's
environment (the value is taken literally, so it must hold no newline), and writes
``print TEXT`` lines to the task's output: the batch step's first task uses that to
tell the user, in their own output, why this attempt runs and what it resumes from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TextIO

from wrapper import jobrecord, log
from wrapper import state as state_mod
from wrapper.config import Config
from wrapper.errors import EXIT_OK, JobwrapError
from wrapper.slurm.context import JobContext
from wrapper.state import JobState

BATCH_STEP_IDS = ("batch", "4294967294")


def exports(ctx: JobContext, cfg: Config, record: jobrecord.JobRecord | None,
            resume_from: str | None) -> dict[str, str]:
    values = {
        "JOBWRAP_ATTEMPT": str(ctx.attempt),
        "JOBWRAP_SCRATCH": os.path.join(cfg.paths.scratch_root, ctx.job_id),
    }
    if record is not None and record.checkpoint_dir:
        values["JOBWRAP_CHECKPOINT_DIR"] = record.checkpoint_dir
    if resume_from:
        values["JOBWRAP_RESUME_FROM"] = resume_from
    return values


def run(ctx: JobContext, cfg: Config, out: TextIO, env: Mapping[str, str] | None = None) -> int:
    environ = os.environ if env is None else env
    state = state_mod.for_job(cfg, ctx.job_id)
    record = None
    try:
        record = jobrecord.load(state)
    except JobwrapError as exc:
        log.get().warning("task-prolog.no_record", error=str(exc))
    resume, step = _resume_point(ctx, cfg, record, batch=_is_batch(environ))
    values = exports(ctx, cfg, record, resume)
    # Export first: the job must get its variables even if what follows fails.
    for name, value in values.items():
        if "\n" not in value:
            out.write(f"export {name}={value}\n")
    if ctx.attempt > 0 and _is_batch(environ):
        out.write(f"print {_banner(ctx, state, resume, step)}\n")
    refused = _staging_failure(ctx, state)
    if refused:
        # The job's data is not there: running it would only fail later, less clearly.
        out.write(f"print jobwrap: the job did not start: {refused}\n")
        out.flush()
        return 1
    out.flush()
    extra = {}
    if environ.get("SLURM_LOCALID", "0") == "0":  # once per node and step
        from wrapper.archive.jobenv import claims

        # Where the job's environment came from, for the manifest: the user's claims.
        extra["environment"] = claims(environ)
    try:
        state.append("task-prolog.context", as_user=True, node=ctx.node, hook=ctx.hook,
                     attempt=ctx.attempt, uid=os.getuid(),
                     step=environ.get("SLURM_STEP_ID", ""), task=environ.get("SLURM_PROCID", ""),
                     context=ctx.as_dict(), exports=values, **extra)
    except JobwrapError as exc:
        log.get().warning("task-prolog.state_unavailable", error=str(exc))
    return EXIT_OK


def _staging_failure(ctx: JobContext, state: JobState) -> str:
    """Why this node's prolog could not prepare the job: its data or its directives."""
    for event in state.events():
        if event.get("source") != "root" or event.get("node") != ctx.node or \
                event.get("attempt") != ctx.attempt:
            continue
        if (event.get("event") == "staging.failed" and event.get("direction") == "in") or \
                event.get("event") == "directives.invalid":
            return " ".join(str(event.get("error", "")).split())
    return ""


def _is_batch(env: Mapping[str, str]) -> bool:
    return env.get("SLURM_STEP_ID", "batch") in BATCH_STEP_IDS and \
        env.get("SLURM_PROCID", "0") == "0"


def _resume_point(ctx: JobContext, cfg: Config, record: jobrecord.JobRecord | None,
                  batch: bool) -> tuple[str | None, int | None]:
    """The latest valid checkpoint, read with this (the job user's) rights; attempts >= 1."""
    if ctx.attempt < 1 or record is None or not record.checkpoint_dir:
        return None, None
    from wrapper.checkpoints import latest_valid

    options = record.job_options
    # Before the batch script runs nothing is writing; later steps may be mid-write.
    settle = 0.0 if batch else cfg.supervisor.settle_seconds
    found = latest_valid(record.checkpoint_dir, glob=options.checkpoint_glob,
                         marker=options.checkpoint_marker, settle_seconds=settle).latest
    return (found.path, found.step) if found else (None, None)


def _banner(ctx: JobContext, state: JobState, resume: str | None, step: int | None) -> str:
    ends = [e for e in state.events() if e.get("source") == "root"
            and e.get("event") in ("attempt.end", "prolog.unhealthy")]
    why = ""
    if ends and ends[-1]["event"] == "prolog.unhealthy":
        why = (f" after node {ends[-1].get('node')} failed its health check "
               f"({ends[-1].get('reason')})")
    elif ends:
        why = f" after {ends[-1].get('kind')} ({ends[-1].get('detail')})"
    where = f"resuming from {resume}" + (f" (step {step})" if step is not None else "") \
        if resume else "no valid checkpoint: starting from the beginning"
    return f"jobwrap: attempt {ctx.attempt}{why}; {where}"
