"""Archive every job's logs and a reproducibility manifest at its end; tell its attempts' story.

Modules, one concept each: ``patterns`` (Slurm's filename patterns), ``collect`` (one
attempt's files on one node, read with the right rights), ``manifest`` (the
``manifest.json`` schema and builder), ``store`` (the archive on disk: atomic writes,
list, extract, prune), ``status`` (the timeline of a job's attempts), ``ledger`` (a
job's goodput ledger from that timeline, kept in the index), ``info`` (one job's archive
in one line), ``spool`` (the record per job the epilog drops for the index), ``index``
(one record per job, folded from the spool), ``carry`` (root's verdicts on earlier
attempts, from the archive to the next attempt's nodes), ``attempt`` (the epilog's entry
point, :func:`archive_attempt`) and ``cli`` (``jobwrap archive ...``, and the attempts
``jobwrap status`` tells).

The package's names load on first use: a prolog that reads only the store (``carry``)
does not pay for the archive's writer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wrapper.archive._fs import ArchiveError
    from wrapper.archive.attempt import ArchiveResult, archive_attempt

__all__ = ["ArchiveError", "ArchiveResult", "archive_attempt"]


def __getattr__(name: str) -> Any:
    if name == "ArchiveError":
        from wrapper.archive import _fs

        return _fs.ArchiveError
    if name in ("ArchiveResult", "archive_attempt"):
        from wrapper.archive import attempt

        return getattr(attempt, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
