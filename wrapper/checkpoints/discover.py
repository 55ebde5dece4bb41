"""``latest_valid``: one listing, candidates ordered by their names, validated newest first.

Cost: one ``os.scandir``, a regular-expression match per name, and I/O only for the
candidates actually judged (usually one: a ``stat``, then a 64 KiB tail read or a
marker ``lstat``); mtimes are asked only where names cannot order the candidates.
"""

from __future__ import annotations

import heapq
import math
import operator
import os
import stat
import time
from collections.abc import Callable, Iterator, Sequence

from wrapper.checkpoints.layout import (
    Candidate,
    Context,
    Layout,
    NotACheckpoint,
    Rejected,
    registered,
)
from wrapper.checkpoints.layouts.generic import Generic
from wrapper.checkpoints.listing import Listing
from wrapper.checkpoints.records import Checkpoint, Discovery, Skipped
from wrapper.errors import UserInputError

_RANK = operator.attrgetter("rank")
NESTED = "checkpoints"  # Accelerate's automatic_checkpoint_naming folder, looked into once


def latest_valid(directory: str | os.PathLike[str], *, glob: str | None = None,
                 marker: str | None = None, settle_seconds: float = 10.0,
                 now: float | None = None,
                 reject: Callable[[Checkpoint], str | None] | None = None) -> Discovery:
    """The newest complete checkpoint in ``directory``, and every newer one passed over.

    ``reject``: the caller's own verdict on a complete checkpoint (a reason to pass it
    over, or None), e.g. the restart policy's suspects.

    Raises UserInputError for arguments that cannot work (an empty directory name, a
    marker without a glob, a glob with ``/``, a negative settle time); a directory that
    is missing or unreadable is an answer instead: no checkpoint, and why.
    """
    raw = os.fspath(directory)
    if not raw:
        raise UserInputError("checkpoint directory: empty path")
    if marker is not None and glob is None:
        raise UserInputError("a checkpoint completion marker needs a glob that says which "
                             "names it completes")
    if not math.isfinite(settle_seconds) or settle_seconds < 0:
        raise UserInputError(f"settle time {settle_seconds!r}: expected seconds >= 0")
    layouts: Sequence[Layout] = (Generic(glob, marker),) if glob is not None else registered()
    root = os.path.abspath(raw)
    real_root = os.path.realpath(root)
    try:
        listing = Listing.scan(root, real_root)
    except OSError as exc:
        return Discovery(None, [Skipped(root, _directory_problem(exc))], None)
    ctx = Context(real_root, time.time() if now is None else now, settle_seconds)
    skipped: list[Skipped] = []
    first_layout: str | None = None
    for candidate in _newest_first(_propose(layouts, listing), listing):
        try:
            found = _judge(candidate, listing, ctx)
        except NotACheckpoint:
            continue
        except Rejected as exc:
            skipped.append(Skipped(listing.path(candidate.name), exc.reason))
            first_layout = first_layout or candidate.layout.name
            continue
        why = reject(found) if reject is not None else None
        if why:
            skipped.append(Skipped(found.path, why))
            continue
        return Discovery(found, skipped, found.layout)
    nested = listing.get(NESTED)
    if first_layout is None and glob is None and nested is not None \
            and not nested.is_symlink and nested.is_dir(real_root):
        # Accelerate's project folder: its checkpoints are in checkpoints/checkpoint_N.
        return latest_valid(os.path.join(root, NESTED), settle_seconds=settle_seconds,
                            now=ctx.now)
    return Discovery(None, skipped, first_layout)


def _directory_problem(exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such directory"
    if isinstance(exc, NotADirectoryError):
        return "not a directory"
    return f"unreadable directory: {exc.strerror or exc}"


def _propose(layouts: Sequence[Layout], listing: Listing) -> list[Candidate]:
    """The candidates of the first tier in which any layout recognised something."""
    for tier in sorted({layout.tier for layout in layouts}):
        found: list[Candidate] = []
        for layout in layouts:
            if layout.tier == tier:
                found.extend(layout.candidates(listing))
        if found:
            return found
    return []


def _mtime(candidate: Candidate, listing: Listing) -> float:
    name = candidate.order_name
    entry = candidate.entry if name is None else listing.get(name)
    return entry.mtime(listing.real_root) if entry is not None else float("-inf")


def _series(group: list[Candidate], listing: Listing) -> Iterator[Candidate]:
    """One series newest first: by rank, and by mtime among equal ranks or without ranks."""
    if group[0].rank is None:
        yield from sorted(group, key=lambda c: (_mtime(c, listing), c.name), reverse=True)
        return
    # A ranked series is ranked throughout (see Candidate); the key runs in C, which
    # matters with 10,000 of them.
    ordered = sorted(group, key=_RANK, reverse=True)
    start = 0
    while start < len(ordered):
        end = start + 1
        while end < len(ordered) and ordered[end].rank == ordered[start].rank:
            end += 1
        if end - start == 1:
            yield ordered[start]
        else:  # one step saved twice (Lightning's -v1): the newer first
            yield from sorted(ordered[start:end], key=lambda c: (_mtime(c, listing), c.name),
                              reverse=True)
        start = end


def _newest_first(candidates: list[Candidate], listing: Listing) -> Iterator[Candidate]:
    """Every series newest first, merged by the mtime of each series' next candidate."""
    groups: dict[str, list[Candidate]] = {}
    for c in candidates:
        group = groups.get(c.series)
        if group is None:
            groups[c.series] = [c]
        else:
            group.append(c)
    series = [_series(group, listing) for group in groups.values()]
    if len(series) == 1:
        yield from series[0]  # names alone order it: no stat at all
        return
    heads: list[tuple[float, int, Candidate]] = []
    for index, it in enumerate(series):
        head = next(it, None)
        if head is not None:
            heads.append((-_mtime(head, listing), index, head))
    heapq.heapify(heads)
    while heads:
        _, index, head = heapq.heappop(heads)
        yield head
        following = next(series[index], None)
        if following is not None:
            heapq.heappush(heads, (-_mtime(following, listing), index, following))


def _seconds(value: float) -> str:
    return f"{round(value, 1):g}"


def _still_written(age: float, settle: float) -> str:
    when = f"{_seconds(age)} s ago" if age >= 0 else f"{_seconds(-age)} s in the future"
    return f"still being written: modified {when} (< settle {_seconds(settle)} s)"


def _judge(candidate: Candidate, listing: Listing, ctx: Context) -> Checkpoint:
    """The checkpoint, or Rejected with the reason (NotACheckpoint: ignore it)."""
    entry = candidate.entry
    if entry is not None and entry.temp:
        raise Rejected("temporary name")
    if candidate.reason:
        raise Rejected(candidate.reason)
    if entry is None:
        raise Rejected("does not exist")
    real = entry.real_path(ctx.real_root)
    if real is None:
        raise Rejected(f"symlink pointing outside {listing.root}: not followed")
    try:
        # lstat: ``real`` has no symlink left in it unless one was swapped in since the
        # listing, and that must not be followed either.
        st = os.lstat(real)
    except FileNotFoundError:
        raise Rejected("vanished while being checked") from None
    except OSError as exc:
        raise Rejected(f"unreadable: {exc.strerror or exc}") from None
    is_dir, is_file = stat.S_ISDIR(st.st_mode), stat.S_ISREG(st.st_mode)
    if candidate.expect_dir is True and not is_dir:
        raise Rejected("not a directory")
    if candidate.expect_dir is False and not is_file:
        raise Rejected("not a regular file")
    if not (is_dir or is_file):
        raise Rejected("neither a regular file nor a directory")
    try:
        newest = candidate.layout.inspect(candidate, real, st, ctx)
        for name in candidate.evidence:
            evidence = listing.get(name)
            evidence_real = evidence.real_path(ctx.real_root) if evidence else None
            if evidence_real is not None:
                newest = max(newest, os.stat(evidence_real).st_mtime)
    except Rejected as exc:
        age = ctx.now - st.st_mtime
        if age < ctx.settle_seconds:
            raise Rejected(f"{_still_written(age, ctx.settle_seconds)}; {exc.reason}") from None
        raise
    except FileNotFoundError:
        raise Rejected("vanished while being checked") from None
    except OSError as exc:
        raise Rejected(f"unreadable: {exc.strerror or exc}") from None
    age = ctx.now - newest
    if age < ctx.settle_seconds:
        raise Rejected(_still_written(age, ctx.settle_seconds))
    return Checkpoint(listing.path(candidate.name), candidate.layout.name, candidate.step,
                      st.st_mtime)
