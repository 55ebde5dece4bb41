"""The epilog (root, every allocated node): record how the job ended on this node."""

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
    # The prolog normally made the directory; an epilog after a failed prolog must not fail.
    state.prepare(ctx.uid, ctx.gid)
    state.append("epilog.context", node=ctx.node, hook=ctx.hook, attempt=ctx.attempt,
                 context=ctx.as_dict())
    log.get().info("epilog.done", exit_code=ctx.exit_code, exit_signal=ctx.exit_signal)
    return EXIT_OK
