"""Every file of one job, named in one place (after submitit's ``JobPaths``).

Root's state folder ``<state_dir>/jobs/<jobid>/`` holds:

- ``events.jsonl``: root's events (only root writes it; the decisions read it);
- ``user-events.jsonl``: what the job user's side wrote (task-prolog, supervisor): claims;
- ``supervisor-facts.jsonl``: the supervisor's root-owned, write-only report channel;
- ``job.json``: what the prolog gathered of the job (``wrapper.job.record``);
- ``batch-script.sh``: the batch script, fetched from Slurm once per attempt;
- ``supervisor.log``: the supervisor's log, root's file the user may read.

And on each node the job's scratch, ``<scratch_root>/<jobid>``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from wrapper.fastdataclass import dataclass

if TYPE_CHECKING:
    from wrapper.config import Config

EVENTS = "events.jsonl"
USER_EVENTS = "user-events.jsonl"
SUPERVISOR_FACTS = "supervisor-facts.jsonl"
PULSE_HANG_FILE = "pulse-hang.json"  # the pulse judge's hang verdict, for the supervisor
PULSE_SPEED_FILE = "pulse-speed.json"  # every node's newest speed score, for the epilog
RECORD = "job.json"
BATCH_SCRIPT = "batch-script.sh"
SUPERVISOR_LOG = "supervisor.log"
JOB_ID = re.compile(r"^[0-9]{1,12}$")


def scratch_of(scratch_root: str | Path, job_id: str) -> Path:
    """The job's scratch folder on this node (the one place that computes it)."""
    return Path(scratch_root) / job_id


@dataclass(frozen=True)
class JobPaths:
    """The paths of one job's files under root's state folder and the node's scratch."""

    state_dir: Path
    job_id: str
    scratch_root: Path = Path("/local/jobwrap")

    def __post_init__(self) -> None:
        if not JOB_ID.match(self.job_id):
            raise ValueError(f"{self.job_id!r} is not a job id; refusing to use it in a path")

    @classmethod
    def of(cls, cfg: Config, job_id: str) -> JobPaths:
        return cls(Path(cfg.paths.state_dir), job_id, Path(cfg.paths.scratch_root))

    @property
    def folder(self) -> Path:
        return self.state_dir / "jobs" / self.job_id

    @property
    def events(self) -> Path:
        return self.folder / EVENTS

    @property
    def user_events(self) -> Path:
        return self.folder / USER_EVENTS

    @property
    def supervisor_facts(self) -> Path:
        return self.folder / SUPERVISOR_FACTS

    @property
    def record(self) -> Path:
        return self.folder / RECORD

    @property
    def batch_script(self) -> Path:
        return self.folder / BATCH_SCRIPT

    @property
    def supervisor_log(self) -> Path:
        return self.folder / SUPERVISOR_LOG

    @property
    def scratch(self) -> Path:
        return scratch_of(self.scratch_root, self.job_id)
