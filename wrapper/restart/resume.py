"""Where an attempt resumes from, and the JOBWRAP_* variables that tell the job.

The one owner of the latest-checkpoint lookup (``latest``, and ``latest_as`` with the job
user's rights for root's hooks) and of the variables the job sees (``exports``), for the
task-prolog, ``jobwrap run`` and the supervisor alike.

Falling back: a checkpoint root judged suspect (an attempt resumed from it and failed by
its own fault before a newer one appeared; ``wrapper.job.events.CheckpointSuspect``) is
passed over, and so is anything newer than it that already existed when it was judged
(``passed_over``). What is written after the verdict (the fallback attempt's progress, or
the suspect's file rewritten) counts again. Nothing is ever deleted.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from wrapper.fastdataclass import dataclass

if TYPE_CHECKING:
    from wrapper.checkpoints import Checkpoint
    from wrapper.job.events import CheckpointSuspect
    from wrapper.job.record import JobRecord
    from wrapper.job.store import JobStore
    from wrapper.osl.users import UserIds
    from wrapper.submit.directives import JobOptions

ATTEMPT = "JOBWRAP_ATTEMPT"
SCRATCH = "JOBWRAP_SCRATCH"
CHECKPOINT_DIR = "JOBWRAP_CHECKPOINT_DIR"
RESUME_FROM = "JOBWRAP_RESUME_FROM"
# Set by `jobwrap run` in its command's environment, to its job's id: the attempt and the
# resume point it chose between two runs of the command, which a step's task-prolog
# leaves as they are. A job submitted from inside such a command inherits the variable
# (sbatch exports the environment): under another job's id it means nothing.
UNDER_RUN = "JOBWRAP_RUN"


def under_run(environ: Mapping[str, str]) -> bool:
    """Whether this process runs under ``jobwrap run`` of its own job."""
    value = environ.get(UNDER_RUN, "")
    return bool(value) and value == environ.get("SLURM_JOB_ID", value)


def under_run_value(environ: Mapping[str, str]) -> str:
    """What ``jobwrap run`` sets UNDER_RUN to: its job's id ("1" outside a job)."""
    return environ.get("SLURM_JOB_ID") or "1"
# The file the supervisor touches before the time limit: a loop that sees it saves.
SAVE_FILE = "JOBWRAP_SAVE_FILE"
SAVE_FILE_NAME = ".jobwrap-save-now"


def save_file(checkpoint_dir: str | None) -> str | None:
    """Where the save request appears: in the checkpoint folder, which every rank sees."""
    import os

    return os.path.join(checkpoint_dir, SAVE_FILE_NAME) if checkpoint_dir else None


@dataclass(frozen=True)
class Found:
    """The latest valid checkpoint."""

    path: str
    step: int | None
    layout: str = ""
    mtime: float = 0.0
    passed_over: tuple[str, ...] = ()  # newer complete checkpoints skipped as suspect

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "step": self.step, "layout": self.layout,
                "mtime": self.mtime, "passed_over": list(self.passed_over)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Found:
        return cls(str(data["path"]), data.get("step"), str(data.get("layout", "")),
                   float(data.get("mtime", 0.0)), tuple(data.get("passed_over", ())))


@dataclass(frozen=True)
class Suspect:
    """A checkpoint judged suspect at ``marked_at`` (root's clock, seconds since the epoch)."""

    path: str
    step: int | None
    mtime: float
    marked_at: float

    @classmethod
    def of(cls, event: CheckpointSuspect) -> Suspect:
        return cls(event.path, event.step, event.mtime, event.ts)

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "step": self.step, "mtime": self.mtime,
                "marked_at": self.marked_at}


def why_passed_over(path: str, step: int | None, mtime: float,
                    suspects: Iterable[Suspect]) -> str | None:
    """Why a complete checkpoint is not resumed from (None: it may be)."""
    for s in suspects:
        if mtime > s.marked_at:
            continue  # written after the verdict: new progress, or the suspect rewritten
        if path == s.path:
            return "suspect: an attempt resumed from it and failed before a newer one appeared"
        newer = step > s.step if step is not None and s.step is not None else mtime > s.mtime
        if newer:
            return f"newer than the suspect checkpoint {s.path}"
    return None


def latest(directory: str | None, options: JobOptions, *, settle_seconds: float = 0.0,
           suspects: Sequence[Suspect] = (), now: float | None = None) -> Found | None:
    """The latest valid checkpoint in ``directory`` (read with the caller's rights),
    passing over ``suspects`` and what is newer than them.

    ``settle_seconds`` 0 when nothing can be writing (between attempts, before the
    batch script runs); the supervisor's settle time while the job may be mid-write.
    """
    if not directory:
        return None
    from wrapper.checkpoints import latest_valid

    passed: list[str] = []

    def reject(found: Checkpoint) -> str | None:
        why = why_passed_over(found.path, found.step, found.mtime, suspects)
        if why:
            passed.append(found.path)
        return why

    found = latest_valid(directory, glob=options.checkpoint_glob,
                         marker=options.checkpoint_marker, settle_seconds=settle_seconds,
                         now=now, reject=reject if suspects else None).latest
    return Found(found.path, found.step, found.layout, found.mtime, tuple(passed)) \
        if found else None


def latest_as(user: UserIds, directory: str | None, options: JobOptions, *,
              suspects: Sequence[Suspect] = (), timeout: float = 10.0) -> Found | None:
    """``latest`` with the job user's rights (root's hooks: the user's directory), once
    the job has stopped writing. Raises JobwrapError when it cannot be looked up."""
    if not directory:
        return None
    from wrapper.osl.child import call_as

    found = call_as(user, _latest_plain, directory, options.checkpoint_glob,
                    options.checkpoint_marker, [s.as_dict() for s in suspects],
                    timeout=timeout)
    return Found.from_dict(found) if found else None


def _latest_plain(directory: str, glob: str | None, marker: str | None,
                  suspects: list[dict[str, Any]]) -> dict[str, Any] | None:
    """In the user's child: plain data in and out across its pipe."""
    from wrapper.submit.directives import JobOptions

    found = latest(directory, JobOptions(checkpoint_glob=glob, checkpoint_marker=marker),
                   suspects=[Suspect(**s) for s in suspects])
    return found.as_dict() if found else None


def exports(*, attempt: int, scratch: str | None, checkpoint_dir: str | None,
            resume_from: str | None) -> dict[str, str]:
    """The JOBWRAP_* variables of one attempt (JOBWRAP_RESUME_FROM only when one exists)."""
    values = {ATTEMPT: str(attempt)}
    if scratch is not None:
        values[SCRATCH] = scratch
    if checkpoint_dir:
        values[CHECKPOINT_DIR] = checkpoint_dir
        values[SAVE_FILE] = save_file(checkpoint_dir) or ""
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


def choose(store: JobStore, record: JobRecord, *, attempt: int, node: str,
           timeout: float = 10.0) -> Found | None:
    """Root's pick, for the prolog of a requeued attempt on the job's first node: the
    checkpoint it resumes from, looked up as the user and recorded as root's fact
    (``resume.chosen``), which the task-prolog exports and the epilog judges."""
    from wrapper import log
    from wrapper.errors import JobwrapError
    from wrapper.job import events as ev
    from wrapper.osl.users import UserIds

    if attempt < 1 or not record.checkpoint_dir:
        return None
    suspects = [Suspect.of(e) for e in store.suspects()]
    try:
        found = latest_as(UserIds.of(record.uid, record.gid), record.checkpoint_dir,
                          record.job_options, suspects=suspects, timeout=timeout)
    except JobwrapError as exc:  # the task-prolog looks for itself, as before
        log.get().warning("prolog.checkpoints_unreadable", error=str(exc))
        return None
    if found is not None:
        store.record(ev.ResumeChosen(attempt=attempt, node=node, path=found.path,
                                     step=found.step, mtime=found.mtime,
                                     passed_over=list(found.passed_over)))
    return found
