"""Root's verdicts on a job's earlier attempts, carried to the nodes of its next one.

Each node keeps its state folder to itself (``/var/lib/jobwrap``). Root's verdict on an
attempt (``attempt.end``: its class, error signature and checkpoint step, which the
restart brakes weigh), the checkpoints it judged suspect and a node's failed health check
are written on the node that made them, and a requeued job's next attempt often starts on
other nodes (the faulty one is excluded). What crosses to them is the job's archive: root
wrote it (each node's epilog, its part of the attempt, committed before Slurm lets the job
start again: a requeued job stays COMPLETING until every epilog has ended; a prolog that
fails its check archives its own), under ``archive_root``, the one place every node
shares, in folders the job's user may read but not write. Each part keeps root's
verdicts in a small file of their own (``parts.VERDICTS``, bounded), so that what is
read here never grows with what the job wrote. The prolog of a later attempt (and its
first node's epilog, for what its prolog could not read) copies those verdicts into this
node's own folder, once each, with their own time, so that every reader here (the
brakes, the resume's choice, the task-prolog's banner, the supervisor) finds them as if
written here: the newest CARRY_ATTEMPTS attempts, within a share of the prolog's budget.

Where it cannot reach: without an archive (``[archive] enabled = false``), and for an
attempt whose first node Slurm lost before its epilog ran, only this node's own memory
remains; the brakes weigh what there is, and the restart limit, Slurm's count, holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wrapper import log
from wrapper.errors import JobwrapError
from wrapper.job import events as ev

if TYPE_CHECKING:
    from wrapper.config import Config
    from wrapper.job.store import JobStore

# The kinds a later attempt's readers weigh: the brakes and the banner (attempt.end,
# prolog.unhealthy), the resume's choice (checkpoint.suspect).
CARRIED = (ev.AttemptEnd.KIND, ev.CheckpointSuspect.KIND, ev.PrologUnhealthy.KIND)


# What a prolog reads at most: the newest attempts' verdict files (each bounded by
# parts.VERDICTS_MAX_BYTES), within a share of its budget. Past these the brakes weigh
# what was read; the restart limit itself is Slurm's count, never this history's.
CARRY_ATTEMPTS = 16
CARRY_SHARE = 0.25  # of [hooks] prolog_budget, and at most CARRY_MAX_S
CARRY_MAX_S = 10.0


def _key(record: dict[str, Any]) -> tuple[Any, ...]:
    return (record.get("ts"), record.get("event"), record.get("node"), record.get("attempt"))


def earlier_verdicts(cfg: Config, store: JobStore, *, job_id: str, user: str,
                     attempt: int, clock: Callable[[], float] = time.monotonic) -> int:
    """Copy root's verdicts on attempts before ``attempt`` from the job's archive into
    this node's folder where they are missing; returns how many were copied. Never fails
    the hook, never runs past its share of the prolog's budget: an archive that cannot
    be read leaves this node's own memory as it is."""
    if attempt <= 0 or not cfg.archive.enabled or not user:
        return 0
    from wrapper.archive.parts import load_verdicts

    deadline = clock() + min(CARRY_MAX_S, CARRY_SHARE * cfg.hooks.prolog_budget)
    try:
        found = load_verdicts(cfg.paths.archive_root, job_id, user, before=attempt,
                              attempts=CARRY_ATTEMPTS, deadline=deadline, clock=clock)
    except (JobwrapError, OSError) as exc:
        log.get().info("carry.no_archive", error=str(exc))
        return 0
    have = {_key(r) for r in store.state.events(root_only=True)}
    copied = 0
    for record in sorted(_verdicts(found, attempt), key=_ts):
        if _key(record) in have:
            continue
        data = {k: v for k, v in record.items() if k not in ("event", "source")}
        store.state.append(str(record["event"]), **data)
        have.add(_key(record))
        copied += 1
    if copied:
        log.get().info("carry.verdicts", copied=copied)
    return copied


def _ts(record: dict[str, Any]) -> float:
    value = record.get("ts")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else 0.0


def _verdicts(records: list[dict[str, Any]], attempt: int) -> list[dict[str, Any]]:
    """Root's records of the carried kinds for earlier attempts, of a format this jobwrap
    reads (a newer one's, mid-upgrade, stays where it is)."""
    from wrapper.job.state import EVENTS_FORMAT, FORMAT_KEY

    found = []
    for record in records:
        if record.get("source") != "root" or record.get("event") not in CARRIED:
            continue
        if record.get(FORMAT_KEY, 1) != EVENTS_FORMAT:
            continue
        number = ev.attempt_of(record)
        if number is not None and number < attempt:
            found.append(record)
    return found


def archived_records(cfg: Config, job_id: str, user: str = "") -> list[dict[str, Any]]:
    """Every event record the job's archive holds, each node's part of each attempt
    (``source``: root's or the user's, as the node that wrote it read them); [] where
    there is none this process may read."""
    if not cfg.archive.enabled:
        return []
    try:
        from wrapper.archive.parts import load_parts

        parts = load_parts(cfg.paths.archive_root, job_id, user or None)
    except (JobwrapError, OSError):
        return []
    return [r for p in parts for r in p.get("events") or [] if isinstance(r, dict)]
