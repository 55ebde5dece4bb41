"""Archive every job's logs and a reproducibility manifest at its end; tell its attempts' story.

Modules, one concept each: ``patterns`` (Slurm's filename patterns), ``collect`` (one
attempt's files on one node, read with the right rights), ``manifest`` (the
``manifest.json`` schema and builder), ``store`` (the archive on disk: atomic writes,
list, extract, prune), ``status`` (the timeline of a job's attempts), ``ledger`` (a
job's goodput ledger from that timeline, kept in the index), ``info`` (one job's archive
in one line), ``spool`` (the record per job the epilog drops for the index), ``index``
(one record per job, folded from the spool), ``attempt`` (the epilog's entry point,
:func:`archive_attempt`) and ``cli`` (``jobwrap archive ...``, and the attempts
``jobwrap status`` tells).
"""

from __future__ import annotations

from wrapper.archive._fs import ArchiveError
from wrapper.archive.attempt import ArchiveResult, archive_attempt

__all__ = ["ArchiveError", "ArchiveResult", "archive_attempt"]
