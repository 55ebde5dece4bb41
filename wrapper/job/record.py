"""What jobwrap knows of a job, gathered once by the prolog and kept in its state.

``job.json`` in the per-job state: the job's user, nodes, GPUs, output files, limits and
its ``#JOBWRAP`` options. The supervisor, the task-prolog and the epilog read it instead
of asking Slurm again. Its ``format`` (``RECORD_FORMAT``; absent: 1) is the rule of
docs/upgrades.md: fields are only ever added within a format, and a newer one is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, field, replace
from typing import TYPE_CHECKING, Any

from wrapper.errors import JobwrapError, UserInputError, format_of
from wrapper.fastdataclass import dataclass
from wrapper.job.paths import RECORD as RECORD
from wrapper.job.state import JobState
from wrapper.slurm import SlurmBackend
from wrapper.slurm.context import JobContext
from wrapper.slurm.parse import asks_signal
from wrapper.slurm.records import slurm_timestamp, time_limit_seconds
from wrapper.submit.directives import JobOptions, allowed_restarts, parse_script

if TYPE_CHECKING:
    from wrapper.config import Config

RECORD_FORMAT = 1  # job.json's "format" (docs/upgrades.md)


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    user: str
    uid: int
    gid: int
    nodes: list[str]
    gpus: list[int]
    work_dir: str
    stdout: str = ""
    stderr: str = ""
    time_limit_s: float | None = None  # None: unlimited
    start_time: float | None = None
    asked_signal: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    options_error: str = ""

    @property
    def job_options(self) -> JobOptions:
        return JobOptions.from_dict(self.options)

    def options_for(self, cfg: Config) -> JobOptions:
        """The job's options with the site's defaults where it gave none (site_options)."""
        return site_options(self.job_options, cfg)

    @property
    def checkpoint_dir(self) -> str | None:
        directory = self.job_options.checkpoint_dir
        if not directory:
            return None
        return directory if os.path.isabs(directory) else os.path.join(self.work_dir, directory)

    @property
    def first_node(self) -> str:
        return self.nodes[0] if self.nodes else ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def stored(self) -> dict[str, Any]:
        """What job.json holds: the record and its format."""
        return {"format": RECORD_FORMAT, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobRecord:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def site_options(options: JobOptions, cfg: Config) -> JobOptions:
    """``options`` with each one the job left unset taken from the site's config: the one
    place a directive meets its site default and its site limit. ``--max-restarts``:
    ``allowed_restarts``; ``--hang-timeout``: ``[supervisor] hang_timeout``, whose 0 means
    no fixed default (None: learned from the job's cadence), while the job's own 0 is
    off."""
    return replace(
        options, max_restarts=allowed_restarts(options, cfg),
        hang_timeout=options.hang_timeout if options.hang_timeout is not None
        else (cfg.supervisor.hang_timeout or None))


def merged_options(given: JobOptions, record: JobRecord | None, cfg: Config) -> JobOptions:
    """What ``jobwrap run`` runs by: its command line (``given``) over the job's own
    ``#JOBWRAP`` directives (root's record of the job, when there is one), the site's
    defaults under both (``site_options``). A script that wraps its command in ``jobwrap
    run --`` need not repeat its directives. The checkpoint folder is the record's, which
    is resolved against the job's work dir; a relative one given on the command line is
    resolved the same way."""
    import os

    # what the command line set (0 restarts is a value; None, () and False are unset)
    set_here = {k: v for k, v in given.as_dict().items()
                if v is not None and v is not False and v != ()}
    merged = {**(record.job_options.as_dict() if record is not None else {}), **set_here}
    work_dir = record.work_dir if record is not None and record.work_dir else None
    folder = set_here.get("checkpoint_dir")
    if folder is None and record is not None and record.checkpoint_dir:
        merged["checkpoint_dir"] = record.checkpoint_dir  # resolved at the prolog
    elif folder is not None and work_dir and not os.path.isabs(folder):
        merged["checkpoint_dir"] = os.path.join(work_dir, folder)
    return site_options(JobOptions.from_dict(merged), cfg)


def gather(ctx: JobContext, backend: SlurmBackend) -> JobRecord:
    """Ask Slurm for what the hook environment lacks: the script, output paths, limits."""
    return gather_in_background(ctx, backend)()[0]


def gather_in_background(ctx: JobContext, backend: SlurmBackend
                         ) -> Callable[[], tuple[JobRecord, str]]:
    """Start the two Slurm queries now, in threads; the returned call waits for them and
    gives the record and the batch script (kept by the prolog: fetched once per attempt).

    The prolog overlaps them with its GPU checks: each is a process start and a round
    trip to slurmctld, the largest part of the prolog's own time.
    """
    import threading

    results: dict[str, Any] = {}

    def ask(name: str, call: Callable[[str], Any]) -> None:
        try:
            results[name] = call(ctx.job_id)
        except BaseException as exc:  # re-raised in the caller's thread
            results[name] = exc

    # Slurm 23.02+ hands the hook what these would fetch (context.known_*): asked only
    # where it does not, so a job start costs slurmctld no call per node there.
    from wrapper.slurm.context import known_info, known_script

    known = {"info": known_info(ctx), "script": known_script(ctx)}
    results.update({k: v for k, v in known.items() if v is not None})
    calls = {"info": backend.job_info, "script": backend.batch_script}
    threads = [threading.Thread(target=ask, args=(name, call), daemon=True)
               for name, call in calls.items() if known[name] is None]
    for thread in threads:
        thread.start()

    def finish() -> tuple[JobRecord, str]:
        for thread in threads:
            thread.join()
        for value in results.values():
            if isinstance(value, BaseException):
                raise value
        return _build(ctx, results["info"], results["script"]), results["script"]

    return finish


def _build(ctx: JobContext, info: dict[str, str], script: str) -> JobRecord:
    options, error = JobOptions(), ""
    try:
        options = parse_script(script)
    except UserInputError as exc:
        error = str(exc)
    return JobRecord(
        job_id=ctx.job_id, user=ctx.user, uid=ctx.uid if ctx.uid is not None else -1,
        gid=ctx.gid if ctx.gid is not None else -1, nodes=ctx.nodes, gpus=ctx.gpus,
        work_dir=info.get("WorkDir") or ctx.work_dir, stdout=info.get("StdOut", ""),
        stderr=info.get("StdErr", ""),
        time_limit_s=time_limit_seconds(info.get("TimeLimit", "")),
        start_time=slurm_timestamp(info.get("StartTime", "")),
        asked_signal=asks_signal(script), options=options.as_dict(),
        options_error=error,
    )


def load(state: JobState) -> JobRecord:
    """The job's record; JobwrapError when the prolog wrote none, FormatTooNew when a newer
    jobwrap did."""
    data = state.read_json(RECORD)
    if data is None:
        raise JobwrapError(f"{state.path / RECORD} is missing or unreadable (the prolog "
                           "writes it; did it run?)")
    format_of(data, "format", known=RECORD_FORMAT, path=state.path / RECORD, what="job record")
    return JobRecord.from_dict(data)
