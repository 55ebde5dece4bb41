"""The prolog (root, every allocated node): prepare the job's state on this node."""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from wrapper import log
from wrapper.config import Config
from wrapper.errors import EXIT_OK
from wrapper.slurm.context import JobContext
from wrapper.state import JobState


def run(ctx: JobContext, cfg: Config, out: TextIO) -> int:
    state = JobState(Path(cfg.paths.state_dir), ctx.job_id)
    state.prepare(ctx.uid, ctx.gid)
    state.append("prolog.context", node=ctx.node, hook=ctx.hook, attempt=ctx.attempt,
                 context=ctx.as_dict())
    log.get().info("prolog.done", gpus=ctx.gpus)
    return EXIT_OK
