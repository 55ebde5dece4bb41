"""The task-prolog (job user, every task): export jobwrap's variables into the job.

Slurm reads ``export NAME=value`` lines from its stdout and puts them in the task's
environment; the value is taken literally, so it must hold no newline.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TextIO

from wrapper import log
from wrapper.config import Config
from wrapper.errors import EXIT_OK, StateError
from wrapper.slurm.context import JobContext
from wrapper.state import JobState


def exports(ctx: JobContext, cfg: Config) -> dict[str, str]:
    return {
        "JOBWRAP_ATTEMPT": str(ctx.attempt),
        "JOBWRAP_SCRATCH": os.path.join(cfg.paths.scratch_root, ctx.job_id),
    }


def run(ctx: JobContext, cfg: Config, out: TextIO) -> int:
    values = exports(ctx, cfg)
    # Export first: the job must get its variables even if recording the event fails.
    for name, value in values.items():
        if "\n" not in value:
            out.write(f"export {name}={value}\n")
    out.flush()
    try:
        JobState(Path(cfg.paths.state_dir), ctx.job_id).append(
            "task-prolog.context", as_user=True, node=ctx.node, hook=ctx.hook,
            attempt=ctx.attempt, uid=os.getuid(), step=os.environ.get("SLURM_STEP_ID", ""),
            task=os.environ.get("SLURM_PROCID", ""), context=ctx.as_dict(), exports=values)
    except StateError as exc:
        log.get().warning("task-prolog.state_unavailable", error=str(exc))
    return EXIT_OK
