"""Each attempt's outcome in Slurm's own accounting: the job's AdminComment.

Set once per attempt end (root, the job's first node) through the Slurm backend
(``set_admin_comment``: scontrol, or sacctmgr once the job has finished, each bounded by
``[slurm] command_timeout``), so ``sacct -o AdminComment`` shows the job's whole story
where sites already look. The text holds only root's vocabulary (attempt numbers,
failure classes, decisions, ETTR), never the job's own words:
``jobwrap: a0=hang/requeue a1=success/done ettr=0.91``. Only an admin (or root) can set
an AdminComment, so the job's user cannot forge it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wrapper.archive.ledger import Ledger
    from wrapper.slurm import SlurmBackend

MAX_COMMENT = 1000  # Slurm stores more; sacct's columns are read by people
_WORD = re.compile(r"[^A-Za-z0-9_.-]")


def comment(ledger: Ledger, decisions: dict[int, str]) -> str:
    """The AdminComment for the job so far; the oldest attempts give way past the cap."""
    parts = [f"a{a.number}={_clean(a.kind)}/{_clean(decisions.get(a.number, '?'))}"
             for a in ledger.attempts if not a.in_place]  # root's verdicts only
    tail = f" ettr={ledger.ettr:.2f}"
    while parts and len("jobwrap: " + " ".join(parts) + tail) > MAX_COMMENT:
        parts = parts[1:]
    return "jobwrap: " + " ".join(parts) + tail


def record(slurm: SlurmBackend, job_id: str, text: str) -> str | None:
    """Set the job's AdminComment; returns the problem, or None when Slurm took it."""
    from wrapper.errors import JobwrapError

    try:
        slurm.set_admin_comment(job_id, text)
    except JobwrapError as exc:
        return str(exc)
    return None


def _clean(word: str) -> str:
    return _WORD.sub("_", word)[:40]
