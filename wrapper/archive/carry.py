"""Root's verdicts on a job's earlier attempts, carried to the nodes of its next one.

Each node keeps its state folder to itself (``/var/lib/jobwrap``). Root's verdict on an
attempt (``attempt.end``: its class, error signature and checkpoint step, which the
restart brakes weigh), the checkpoints it judged suspect and a node's failed health check
are written on the node that made them, and a requeued job's next attempt often starts on
other nodes (the faulty one is excluded). What crosses to them is the job's archive: root
wrote it (each node's epilog, its part of the attempt, committed before Slurm lets the job
start again: a requeued job stays COMPLETING until every epilog has ended), under
``archive_root``, the one place every node shares, in folders the job's user may read but
not write. The prolog of a later attempt copies those verdicts into this node's own
folder, once each, with their own time, so that every reader here (the epilog's brakes,
the resume's choice, the task-prolog's banner, the supervisor) finds them as if written
here. Without an archive (``[archive] enabled = false``) only this node's own memory
remains, and docs/architecture.md says what that costs.
"""

from __future__ import annotations

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


def _key(record: dict[str, Any]) -> tuple[Any, ...]:
    return (record.get("ts"), record.get("event"), record.get("node"), record.get("attempt"))


def earlier_verdicts(cfg: Config, store: JobStore, *, job_id: str, user: str,
                     attempt: int) -> int:
    """Copy root's verdicts on attempts before ``attempt`` from the job's archive into
    this node's folder where they are missing; returns how many were copied. Never fails
    the prolog: an archive that cannot be read leaves this node's own memory as it is."""
    if attempt <= 0 or not cfg.archive.enabled:
        return 0
    try:
        parts = _parts(cfg.paths.archive_root, job_id, user)
    except (JobwrapError, OSError) as exc:
        log.get().info("carry.no_archive", error=str(exc))
        return 0
    have = {_key(r) for r in store.state.events(root_only=True)}
    copied = 0
    for record in sorted(_verdicts(parts, attempt), key=lambda r: float(r.get("ts") or 0)):
        if _key(record) in have:
            continue
        data = {k: v for k, v in record.items() if k not in ("event", "source")}
        store.state.append(str(record["event"]), **data)
        have.add(_key(record))
        copied += 1
    if copied:
        log.get().info("carry.verdicts", copied=copied)
    return copied


def _verdicts(parts: list[dict[str, Any]], attempt: int) -> list[dict[str, Any]]:
    """Root's records of the carried kinds for earlier attempts, as the parts hold them."""
    found = []
    for part in parts:
        for record in part.get("events") or []:
            if not isinstance(record, dict) or record.get("source") != "root" \
                    or record.get("event") not in CARRIED:
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
        parts = _parts(cfg.paths.archive_root, job_id, user)
    except (JobwrapError, OSError):
        return []
    return [r for p in parts for r in p.get("events") or [] if isinstance(r, dict)]


def _parts(root: str, job_id: str, user: str) -> list[dict[str, Any]]:
    from wrapper.archive.parts import load_parts

    return load_parts(root, job_id, user or None)
