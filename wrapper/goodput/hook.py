"""The epilog's one call after an attempt's verdict (the job's first node, root).

``after_attempt`` computes the job's goodput ledger from root's record of it and exports
this attempt's share as metrics; it then notifies the site (``wrapper.notify``) and
writes the outcome into Slurm's accounting (the job's AdminComment). None of it may fail
or hold up the epilog: every step is bounded and its errors are logged.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from wrapper import log

if TYPE_CHECKING:
    from wrapper.config import Config
    from wrapper.goodput.accounting import Ledger
    from wrapper.state import JobState


def after_attempt(cfg: Config, state: JobState, *, attempt: int, node: str, kind: str,
                  decision: str, reason: str = "", user: str = "") -> Ledger | None:
    """Account, export, notify, annotate; returns the ledger (None when it failed).

    Reporting never costs the epilog its archive or its cleanup: whatever goes wrong in
    here (a bug of ours, a record the user's file made absurd) is logged, with its
    traceback, and the epilog goes on.
    """
    try:
        return _after_attempt(cfg, state, attempt=attempt, node=node, kind=kind,
                              decision=decision, reason=reason, user=user)
    except Exception as exc:  # see the docstring: reporting never fails the epilog
        log.get().exception("goodput.failed", error=repr(exc))
        return None


def _after_attempt(cfg: Config, state: JobState, *, attempt: int, node: str, kind: str,
                   decision: str, reason: str, user: str) -> Ledger | None:
    from wrapper.errors import JobwrapError

    if decision in ("requeue", "stop"):
        from wrapper.notify import notify

        notify(cfg, decision, job_id=state.job_id, attempt=attempt, node=node,
               failure_class=kind, user=user, reason=reason)
    try:
        ledger = ledger_of(state)
    except (JobwrapError, OSError, ValueError) as exc:
        log.get().error("goodput.unavailable", error=str(exc))
        return None
    if cfg.metrics.textfile:
        export(cfg, ledger, attempt=attempt, node=node, job_ended=decision != "requeue")
    annotate(cfg, state, ledger)
    return ledger


def annotate(cfg: Config, state: JobState, ledger: Ledger) -> None:
    """The job's AdminComment (``sacct``), from root's own attempt.end records."""
    from wrapper.facts import root_events
    from wrapper.goodput import sacct

    decisions = {int(e["attempt"]): str(e.get("decision") or "?") for e in root_events(state)
                 if e.get("event") == "attempt.end" and isinstance(e.get("attempt"), int)}
    problem = sacct.record(cfg, state.job_id, sacct.comment(ledger, decisions))
    if problem:
        log.get().warning("goodput.admin_comment_failed", error=problem)


def ledger_of(state: JobState, now: float | None = None) -> Ledger:
    from wrapper.archive.status import timeline
    from wrapper.goodput.accounting import account, from_summaries

    return account(from_summaries(timeline(state)), now=time.time() if now is None else now)


def export(cfg: Config, ledger: Ledger, *, attempt: int, node: str, job_ended: bool) -> bool:
    from wrapper import metrics

    entry = next((a for a in ledger.attempts if a.number == attempt), None)
    if entry is None:
        return False
    before = [a for a in ledger.attempts if a.number < attempt]
    gap = (before[-1].kind, entry.gap_before_s) if before else None
    share = entry.startup_s + entry.gap_before_s + entry.productive_s + entry.lost_s
    return metrics.record_goodput(cfg.metrics, failure_class=entry.kind,
                                  productive_s=entry.productive_s, wall_s=share,
                                  lost_s=entry.lost_s, gap=gap,
                                  ended_ettr=ledger.ettr if job_ended else None, node=node)
