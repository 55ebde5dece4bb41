"""Layouts whose completion evidence is a pointer file naming the last complete tag directory.

DeepSpeed (``latest`` -> ``global_stepN/``) and Megatron-LM
(``latest_checkpointed_iteration.txt`` -> ``iter_NNNNNNN/``) write the pointer only
after every rank has finished its part, so: the tag it names is the newest complete
one; a tag numbered above it is partial or abandoned (rejected with that reason); a tag
numbered below it was complete when the pointer moved past it, and is the fallback when
the named one is missing or too fresh.
"""

from __future__ import annotations

from wrapper.checkpoints.evidence import read_pointer
from wrapper.checkpoints.layout import Candidate, Layout, Rejected
from wrapper.checkpoints.listing import Entry, Listing


def read_tag(listing: Listing, pointer: Entry) -> str:
    """The pointer's text; raises Rejected (an escaping link, unreadable, empty, a path)."""
    real = pointer.real_path(listing.real_root)
    if real is None:
        raise Rejected(f"symlink pointing outside {listing.root}: not followed")
    try:
        text = read_pointer(real)
    except OSError as exc:
        raise Rejected(f"{pointer.name} is unreadable: {exc.strerror}") from None
    if "/" in text or "\0" in text or text in (".", ".."):
        raise Rejected(f"{pointer.name} names {text!r}, which is not a name in the directory")
    return text


def without_pointer(layout: Layout, tagged: list[tuple[Entry, int]], series: str,
                    reason: str) -> list[Candidate]:
    """Every tag rejected: with no readable pointer, none is known to be complete."""
    return [Candidate(e.name, e, layout, series, n, n, True, reason=reason) for e, n in tagged]


def around_pointer(layout: Layout, listing: Listing, pointer: Entry, tag: str,
                   target: Entry | None, rank: int | None, tagged: list[tuple[Entry, int]],
                   series: str) -> list[Candidate]:
    """The named tag (its pointer is evidence), the newer ones rejected, the older as fallback."""
    named_series = series if rank is not None else f"{layout.name}:pointer"
    if target is None:
        # Ordered by the pointer's mtime: the missing tag has none of its own.
        found = [Candidate(tag, None, layout, named_series, rank, rank, True,
                           reason=f"{pointer.name} names {tag}, which does not exist",
                           order_name=pointer.name)]
    else:
        target.claimed = True
        found = [Candidate(tag, target, layout, named_series, rank, rank, True,
                           evidence=(pointer.name,))]
    if rank is None:
        return found  # a custom tag: numbered tags cannot be compared with it
    for entry, number in tagged:
        if entry is target:
            continue
        if number > rank:
            found.append(Candidate(entry.name, entry, layout, series, number, number, True,
                                   reason=f"partial: newer than {tag}, which {pointer.name} "
                                          "names"))
        else:
            found.append(Candidate(entry.name, entry, layout, series, number, number, True))
    return found
