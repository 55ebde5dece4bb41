"""Checkpoint interval advice: Young/Daly's optimum, sqrt(2 * MTBF * save time).

Checkpointing every ``tau`` seconds costs ``save/tau`` of the time and loses ``tau/2`` per
failure on average; ``sqrt(2 * MTBF * save)`` minimises the sum (Young 1974, Daly 2006).
``jobwrap status`` suggests it when the job's own interval is off by more than
``FAR`` times either way.

The save time is the median ``save_s`` of the job's checkpoint events when something
measured it; else it is read off the job's newest checkpoint when that is a folder: the
span of its files' modification times (first file written -> last), by ``lstat`` only,
never following a link, at most ``MAX_ENTRIES`` entries. That is a lower bound of the
save (the first file's own write is not in it), which errs toward shorter intervals.
"""

from __future__ import annotations

import json
import math
import os
import stat
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wrapper.archive.index import Index
    from wrapper.archive.ledger import Ledger

FAR = 2.0
MAX_ENTRIES = 2000
MIN_SAVE_S = 0.05  # below this the measurement says nothing


def young_daly(mtbf_s: float, save_s: float) -> float:
    return math.sqrt(2.0 * mtbf_s * save_s)


def advise(interval_s: float | None, mtbf_s: float | None, save_s: float | None) -> str | None:
    """A line of advice, or None when there is nothing to say (or no basis to say it)."""
    if not interval_s or not mtbf_s or not save_s or save_s < MIN_SAVE_S or mtbf_s <= 0:
        return None
    best = young_daly(mtbf_s, save_s)
    if best / FAR <= interval_s <= best * FAR:
        return None
    more = "more" if interval_s > best else "less"
    return (f"checkpoint {more} often: every {_span(best)} instead of every "
            f"{_span(interval_s)} (Young/Daly sqrt(2 x MTBF {_span(mtbf_s)} x save "
            f"{save_s:.1f}s))")


def folder_save_s(path: str) -> float | None:
    """The span of the modification times in the checkpoint folder ``path`` (no link
    followed, bounded); None when it is not a folder or holds fewer than two files."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return None
        times = []
        with os.scandir(path) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_ENTRIES:
                    break
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(info.st_mode):
                    times.append(info.st_mtime)
    except OSError:
        return None
    return max(times) - min(times) if len(times) >= 2 else None


def _span(seconds: float) -> str:
    from wrapper.goodput.view import span

    return span(seconds)


def for_job(archive_root: str, ledger: Ledger, uid: int | None, now: float,
            window_s: float = 30 * 86400, *, index: Index | None = None) -> str | None:
    """The advice ``jobwrap status`` shows for the job whose ledger this is.

    MTBF: the cluster's over the last ``window_s`` (attempt run time per failure), an
    aggregate the archive's index answers (``index``; an ordinary user, who may not read
    it, gets the one the last indexer published in ``.index/summary.json``), else the
    job's own. The archive is never walked for it. The folder is measured with the job
    user's rights (``call_as``); as root with no known user, it is not measured.
    """
    if ledger.checkpoint_interval_s is None:
        return None
    mtbf = cluster_mtbf(archive_root, now, window_s, index)
    if mtbf is None and ledger.failures:
        mtbf = sum(a.ended_at - a.started_at for a in ledger.attempts) / ledger.failures
    save = ledger.save_s
    if save is None and ledger.latest_checkpoint:
        save = _measure(ledger.latest_checkpoint, uid)
    return advise(ledger.checkpoint_interval_s, mtbf, save)


def cluster_mtbf(archive_root: str, now: float, window_s: float,
                 index: Index | None) -> float | None:
    """The cluster's MTBF over ``window_s``: the index's aggregate, else the published
    summary when it is a day old at most and of the same window, else None."""
    from wrapper.archive import index as index_mod
    from wrapper.archive.spool import FOLDER
    from wrapper.errors import JobwrapError

    if index is not None:
        try:
            return index.mtbf(now - window_s)
        except JobwrapError:
            return None
    path = os.path.join(archive_root, FOLDER, index_mod.SUMMARY)
    try:
        with open(path, "rb") as handle:
            summary = json.loads(handle.read(4096))
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or summary.get("window_s") != window_s:
        return None
    written, mtbf = summary.get("written_at"), summary.get("mtbf_s")
    if not isinstance(written, int | float) or not 0 <= now - written <= 86400:
        return None
    return float(mtbf) if isinstance(mtbf, int | float) and mtbf > 0 else None


def _measure(path: str, uid: int | None) -> float | None:
    from wrapper.errors import JobwrapError
    from wrapper.osl.child import call_as
    from wrapper.osl.users import UserIds

    if os.geteuid() == 0 and uid is None:
        return None
    try:
        found = call_as(UserIds.of(uid if uid is not None else os.geteuid()), folder_save_s,
                        path, timeout=5.0)
    except (JobwrapError, OSError):
        return None
    return float(found) if isinstance(found, int | float) else None
