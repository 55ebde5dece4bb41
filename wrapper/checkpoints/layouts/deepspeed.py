"""DeepSpeed: a ``latest`` file naming the last complete tag directory (``global_stepN/``)."""

from __future__ import annotations

import os
import re

from wrapper.checkpoints.layout import Candidate, Context, Rejected, register
from wrapper.checkpoints.listing import Entry, Listing
from wrapper.checkpoints.pointer import around_pointer, read_tag, without_pointer
from wrapper.checkpoints.tagcheck import check_deepspeed_tag

_TAG = re.compile(r"global_step(\d+)")
POINTER = "latest"
SERIES = "deepspeed:global_step"


class DeepSpeed:
    name = "deepspeed"
    tier = 0

    def candidates(self, listing: Listing) -> list[Candidate]:
        tagged: list[tuple[Entry, int]] = []
        for entry in listing.unclaimed(dotted=False):
            if entry.key.startswith("global_step") and (match := _TAG.fullmatch(entry.key)):
                entry.claimed = True
                tagged.append((entry, int(match.group(1))))
        pointer = listing.get(POINTER)
        if pointer is None or pointer.claimed:
            return without_pointer(self, tagged, SERIES,
                                   f"no '{POINTER}' file names it (DeepSpeed writes it once a "
                                   "tag is complete)")
        pointer.claimed = True
        try:
            tag = read_tag(listing, pointer)
        except Rejected as exc:
            return [Candidate(POINTER, pointer, self, "deepspeed:pointer", reason=exc.reason),
                    *without_pointer(self, tagged, SERIES,
                                     f"'{POINTER}' cannot be read, so no tag is known complete")]
        match = _TAG.fullmatch(tag)
        return around_pointer(self, listing, pointer, tag, listing.get(tag),
                              int(match.group(1)) if match else None, tagged, SERIES)

    def inspect(self, candidate: Candidate, path: str, st: os.stat_result,
                ctx: Context) -> float:
        return max(st.st_mtime, check_deepspeed_tag(path))


register(DeepSpeed())
