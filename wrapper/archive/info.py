"""What one job's archive is, in one line: ``ArchiveInfo``, read from its manifest (``info_of``).

``store`` lists the archives as these (``scan``, ``list_archives``, ``prune``), and the
index keeps one per job (``spool.record_of``, ``index.SqliteIndex.jobs``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, field
from typing import Any

from wrapper.fastdataclass import dataclass


@dataclass(frozen=True)
class ArchiveInfo:
    user: str
    job_id: str
    path: str
    updated_at: float
    size: int                      # bytes on disk
    complete: bool                 # the manifest says every part is there
    name: str = ""                 # the job's name, when the manifest knows it
    attempts: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def info_of(root: str, user: str, job_id: str, manifest: dict[str, Any], size: int,
            mtime: float) -> ArchiveInfo:
    """What ``list`` shows of a job, from its manifest ({} when it does not parse)."""
    updated = manifest.get("updated_at")
    if not isinstance(updated, int | float) or isinstance(updated, bool):
        updated = mtime
    job, archive, attempts = (manifest.get(key) for key in ("job", "archive", "attempts"))
    job = job if isinstance(job, dict) else {}
    archive = archive if isinstance(archive, dict) else {}
    attempts = attempts if isinstance(attempts, list) else []
    return ArchiveInfo(user=user, job_id=job_id, path=os.path.join(root, user, job_id),
                       updated_at=float(updated), size=size,
                       complete=bool(archive.get("complete")), name=str(job.get("name") or ""),
                       attempts=[_number(a.get("attempt")) for a in attempts
                                 if isinstance(a, dict)])


def _number(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return 0
