"""Where an attempt resumes from, and the JOBWRAP_* variables that tell the job.

The one owner of the latest-checkpoint lookup (``latest``) and of the variables the job
sees (``exports``), for the task-prolog, ``jobwrap run`` and the supervisor alike, and
of the restart limit's fallback to the site's default (``max_restarts``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wrapper.config import Config
    from wrapper.directives import JobOptions

ATTEMPT = "JOBWRAP_ATTEMPT"
SCRATCH = "JOBWRAP_SCRATCH"
CHECKPOINT_DIR = "JOBWRAP_CHECKPOINT_DIR"
RESUME_FROM = "JOBWRAP_RESUME_FROM"


@dataclass(frozen=True)
class Found:
    """The latest valid checkpoint."""

    path: str
    step: int | None
    layout: str = ""


def max_restarts(options: JobOptions, cfg: Config) -> int:
    """The job's --max-restarts, or the site's default."""
    return options.max_restarts if options.max_restarts is not None \
        else cfg.restart.max_restarts


def latest(directory: str | None, options: JobOptions, *, settle_seconds: float = 0.0
           ) -> Found | None:
    """The latest valid checkpoint in ``directory`` (read with the caller's rights).

    ``settle_seconds`` 0 when nothing can be writing (between attempts, before the
    batch script runs); the supervisor's settle time while the job may be mid-write.
    """
    if not directory:
        return None
    from wrapper.checkpoints import latest_valid

    found = latest_valid(directory, glob=options.checkpoint_glob,
                         marker=options.checkpoint_marker, settle_seconds=settle_seconds).latest
    return Found(found.path, found.step, found.layout) if found else None


def exports(*, attempt: int, scratch: str | None, checkpoint_dir: str | None,
            resume_from: str | None) -> dict[str, str]:
    """The JOBWRAP_* variables of one attempt (JOBWRAP_RESUME_FROM only when one exists)."""
    values = {ATTEMPT: str(attempt)}
    if scratch is not None:
        values[SCRATCH] = scratch
    if checkpoint_dir:
        values[CHECKPOINT_DIR] = checkpoint_dir
    if resume_from:
        values[RESUME_FROM] = resume_from
    return values


def environ(base: Mapping[str, str], values: Mapping[str, str]) -> dict[str, str]:
    """``base`` with ``values`` set and a stale JOBWRAP_RESUME_FROM dropped."""
    env = dict(base)
    env.pop(RESUME_FROM, None)
    env.update(values)
    return env


def absolute(path: str) -> str:
    return os.path.abspath(path)
