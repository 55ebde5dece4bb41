"""The archive index's spool: the one record per job that an epilog drops for the indexer.

The epilog (``store.Writer.commit``, root) writes the job's record (``record_of``) into
``<archive_root>/.index/spool/`` once the manifest is in place (write, fsync, rename);
the indexer (``wrapper.archive.index``) folds the spool into its database. The names
(``FOLDER``, ``SPOOL``), modes and format (``SCHEMA``) both sides keep are here, so that
the store writes the spool without the indexer, and the indexer reads the store.
"""

from __future__ import annotations

import os
import secrets
import time
from typing import Any

from wrapper.archive._fs import Access, make_dir, open_dir, tree_size, write_json_atomic
from wrapper.archive.info import info_of

SCHEMA = 2  # 2: ledgers kept brief (ledger.ledger_brief)
FOLDER = ".index"
SPOOL = "spool"
PRIVATE = Access(gid=0, dir_mode=0o700, file_mode=0o600)
PASSABLE = Access(gid=0, dir_mode=0o711, file_mode=0o644)  # .index: summary.json readable


def record_of(root: str, user: str, job_id: str, manifest: dict[str, Any] | None, size: int,
              mtime: float) -> dict[str, Any]:
    """A job's index record (also the spool file's content) from its manifest, or from
    its folder alone when the manifest does not parse (``parsed`` false: no ledger)."""
    from wrapper.archive.ledger import NOT_A_FAILURE, account, from_summaries, ledger_brief

    info = info_of(root, user, job_id, manifest or {}, size, mtime)
    attempts = (manifest or {}).get("attempts")
    ledger: dict[str, Any] | None = None
    run_s, failures = 0.0, 0
    if isinstance(attempts, list):
        built = account(from_summaries(a for a in attempts if isinstance(a, dict)),
                        now=info.updated_at)
        ledger = ledger_brief(built)
        run_s = sum(a.ended_at - a.started_at for a in built.attempts)
        failures = sum(1 for a in built.attempts  # root's verdicts, as report counts
                       if a.kind not in NOT_A_FAILURE and not a.in_place)
    job = (manifest or {}).get("job")
    uid = job.get("uid") if isinstance(job, dict) else None
    return {"v": SCHEMA, "user": user, "job_id": job_id, "updated_at": info.updated_at,
            "size": size, "complete": info.complete, "name": info.name,
            "uid": uid if isinstance(uid, int) and not isinstance(uid, bool) else None,
            "attempts": info.attempts, "run_s": run_s, "failures": failures,
            "ledger": ledger, "parsed": manifest is not None}


def spool(root: str, root_fd: int, user: str, job_id: str, manifest: dict[str, Any]) -> None:
    """The epilog's part: the job's record into the spool (root, after its manifest is in
    place). Raises OSError or ArchiveError; the caller logs it and goes on."""
    user_fd = open_dir(root_fd, user)
    try:
        job_fd = open_dir(user_fd, job_id)
        try:
            size, mtime = tree_size(job_fd), os.fstat(job_fd).st_mtime
        finally:
            os.close(job_fd)
    finally:
        os.close(user_fd)
    record = record_of(root, user, job_id, manifest, size, mtime)
    index_fd = make_dir(root_fd, FOLDER, PASSABLE)
    try:
        spool_fd = make_dir(index_fd, SPOOL, PRIVATE)
        try:
            name = f"{time.time_ns()}.{user}.{job_id}.{secrets.token_hex(4)}.json"
            write_json_atomic(spool_fd, name, record, PRIVATE)
        finally:
            os.close(spool_fd)
    finally:
        os.close(index_fd)
