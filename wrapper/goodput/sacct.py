"""Each attempt's outcome in Slurm's own accounting: the job's AdminComment.

One ``scontrol update JobId=N AdminComment=...`` per attempt end (root, the job's first
node, bounded by ``[slurm] command_timeout``; ``sacctmgr modify job`` once the job has
finished), so ``sacct -o AdminComment`` shows the
job's whole story where sites already look. The text holds only root's vocabulary
(attempt numbers, failure classes, decisions, ETTR), never the job's own words:
``jobwrap: a0=hang/requeue a1=success/done ettr=0.91``. Only an admin (or root) can set
an AdminComment, so the job's user cannot forge it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wrapper.config import Config
    from wrapper.goodput.accounting import Ledger

MAX_COMMENT = 1000  # Slurm stores more; sacct's columns are read by people
_WORD = re.compile(r"[^A-Za-z0-9_.-]")
_JOB_ID = re.compile(r"^[0-9]{1,12}$")


def comment(ledger: Ledger, decisions: dict[int, str]) -> str:
    """The AdminComment for the job so far; the oldest attempts give way past the cap."""
    parts = [f"a{a.number}={_clean(a.kind)}/{_clean(decisions.get(a.number, '?'))}"
             for a in ledger.attempts]
    tail = f" ettr={ledger.ettr:.2f}"
    while parts and len("jobwrap: " + " ".join(parts) + tail) > MAX_COMMENT:
        parts = parts[1:]
    return "jobwrap: " + " ".join(parts) + tail


def record(cfg: Config, job_id: str, text: str) -> str | None:
    """Set the job's AdminComment; returns the problem, or None when Slurm took it.

    slurmctld takes it while the job is still its own (a requeued attempt); once the job
    has finished (the epilog of its last attempt runs while it completes) only the
    database can, through ``sacctmgr modify job``: at most two bounded commands.
    """
    from wrapper.errors import JobwrapError
    from wrapper.runner import Runner

    if not _JOB_ID.match(job_id):
        return f"{job_id!r} is not a job id"
    timeout = cfg.slurm.command_timeout
    try:
        Runner().run([cfg.slurm.scontrol_command, "update", f"JobId={job_id}",
                      f"AdminComment={text}"], timeout=timeout)
        return None
    except JobwrapError as exc:
        first = str(exc)
    try:
        Runner().run([_sacctmgr(cfg.slurm.scontrol_command), "-i", "modify", "job", "where",
                      f"jobid={job_id}", "set", f"AdminComment={text}"], timeout=timeout)
    except JobwrapError as exc:
        return f"{first}; and then {exc}"
    return None


def _sacctmgr(scontrol: str) -> str:
    """sacctmgr beside the configured scontrol (the same Slurm), else on PATH."""
    import os

    if os.sep in scontrol:
        sibling = os.path.join(os.path.dirname(scontrol), "sacctmgr")
        if os.access(sibling, os.X_OK):
            return sibling
    return "sacctmgr"


def _clean(word: str) -> str:
    return _WORD.sub("_", word)[:40]
