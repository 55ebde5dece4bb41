"""The epilog's one call after an attempt's verdict (the job's first node, root).

``after_attempt`` computes the job's goodput ledger from root's record of it and exports
this attempt's share as metrics; it then notifies the site (``wrapper.notify``) and
writes the outcome into Slurm's accounting (the job's AdminComment). None of it may fail
or hold up the epilog: every step is bounded and its errors are logged.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from wrapper import log

if TYPE_CHECKING:
    from wrapper.archive.ledger import Ledger
    from wrapper.config import Config
    from wrapper.job.state import JobState
    from wrapper.slurm import SlurmBackend


def after_attempt(cfg: Config, state: JobState, slurm: SlurmBackend, *, attempt: int,
                  node: str, kind: str, decision: str, reason: str = "",
                  user: str = "") -> Ledger | None:
    """Account, export, notify, annotate; returns the ledger (None when it failed).

    Reporting never costs the epilog its archive or its cleanup: whatever goes wrong in
    here (a bug of ours, a record the user's file made absurd) is logged, with its
    traceback, and the epilog goes on.
    """
    try:
        return _after_attempt(cfg, state, slurm, attempt=attempt, node=node, kind=kind,
                              decision=decision, reason=reason, user=user)
    except Exception as exc:  # see the docstring: reporting never fails the epilog
        log.get().exception("goodput.failed", error=repr(exc))
        return None


def _after_attempt(cfg: Config, state: JobState, slurm: SlurmBackend, *, attempt: int,
                   node: str, kind: str, decision: str, reason: str,
                   user: str) -> Ledger | None:
    from wrapper.archive.ledger import account, from_summaries
    from wrapper.errors import JobwrapError

    if decision in ("requeue", "stop"):
        from wrapper.notify import notify

        notify(cfg, decision, job_id=state.job_id, attempt=attempt, node=node,
               failure_class=kind, user=user, reason=reason)
    archive_root = cfg.paths.archive_root if cfg.archive.enabled else ""
    try:
        records = attempt_records(state, archive_root, user)
        ledger = account(from_summaries(records), now=time.time())
    except (JobwrapError, OSError, ValueError) as exc:
        log.get().error("goodput.unavailable", error=str(exc))
        return None
    if cfg.metrics.textfile:
        export(cfg, ledger, attempt=attempt, node=node, job_ended=decision != "requeue")
    annotate(slurm, state, ledger, records)
    return ledger


def annotate(slurm: SlurmBackend, state: JobState, ledger: Ledger,
             records: list[dict[str, Any]]) -> None:
    """The job's AdminComment (``sacct``), from root's records of its attempts."""
    from wrapper.goodput import sacct

    decisions = {int(r["attempt"]): str(r.get("decision") or "?") for r in records
                 if isinstance(r.get("attempt"), int)}
    problem = sacct.record(slurm, state.job_id, sacct.comment(ledger, decisions))
    if problem:
        log.get().warning("goodput.admin_comment_failed", error=problem)


def ledger_of(state: JobState, now: float | None = None, *, archive_root: str = "",
              user: str = "") -> Ledger:
    """The job's ledger from this node's state, with the attempts only the archive knows.

    The state folder is node-local: an attempt that ran on another node is known here
    only through the job's manifest (written by root on that node, before this epilog).
    """
    from wrapper.archive.ledger import account, from_summaries

    return account(from_summaries(attempt_records(state, archive_root, user)),
                   now=time.time() if now is None else now)


def attempt_records(state: JobState, archive_root: str = "",
                    user: str = "") -> list[dict[str, Any]]:
    """The job's attempts (``AttemptSummary`` dicts): this node's, then the archive's. An
    attempt no hook of this node ran (only root's verdict on it is here, carried by the
    next attempt's prolog: wrapper/archive/carry.py) is the archive's, which holds its
    whole story, where the archive has it."""
    from wrapper.archive.status import timeline
    from wrapper.errors import JobwrapError
    from wrapper.job.store import JobStore

    records = {s.attempt: s.as_dict() for s in timeline(JobStore(state))}
    if archive_root:
        from wrapper.archive import store

        try:
            manifest = store.load_manifest(archive_root, state.job_id, user or None)
        except (JobwrapError, OSError):
            manifest = {}
        for entry in manifest.get("attempts") or []:
            number = entry.get("attempt") if isinstance(entry, dict) else None
            if isinstance(number, int) and (number not in records
                                            or not records[number].get("nodes")):
                records[number] = entry
    return [records[n] for n in sorted(records)]


def export(cfg: Config, ledger: Ledger, *, attempt: int, node: str, job_ended: bool) -> bool:
    from wrapper import metrics

    # the attempt's parts (restarts inside it cut it), as one: the class is root's verdict
    # (its last part's), the gap the one before its start
    parts = [a for a in ledger.attempts if a.number == attempt]
    if not parts:
        return False
    before = [a for a in ledger.attempts if a.number < attempt]
    gap = (before[-1].kind, parts[0].gap_before_s) if before else None
    share = sum(a.startup_s + a.gap_before_s + a.productive_s + a.lost_s for a in parts)
    return metrics.record_goodput(cfg.metrics, failure_class=parts[-1].kind,
                                  productive_s=sum(a.productive_s for a in parts),
                                  wall_s=share, lost_s=sum(a.lost_s for a in parts), gap=gap,
                                  ended_ettr=ledger.ettr if job_ended else None, node=node)
