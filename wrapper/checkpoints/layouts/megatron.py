"""Megatron-LM: ``latest_checkpointed_iteration.txt`` naming ``iter_NNNNNNN/`` (or ``release/``)."""

from __future__ import annotations

import os
import re

from wrapper.checkpoints.dcpmeta import DCP_MARKER, check_dcp_folder
from wrapper.checkpoints.layout import Candidate, Context, Rejected, register
from wrapper.checkpoints.listing import Entry, Listing
from wrapper.checkpoints.pointer import around_pointer, read_tag, without_pointer
from wrapper.checkpoints.tagcheck import check_megatron_iteration

_ITER = re.compile(r"iter_(\d+)")
POINTER = "latest_checkpointed_iteration.txt"
RELEASE = "release"
SERIES = "megatron:iter"


class Megatron:
    name = "megatron"
    tier = 0

    def candidates(self, listing: Listing) -> list[Candidate]:
        tagged: list[tuple[Entry, int]] = []
        for entry in listing.unclaimed(dotted=False):
            if entry.key.startswith("iter_") and (match := _ITER.fullmatch(entry.key)):
                entry.claimed = True
                tagged.append((entry, int(match.group(1))))
        pointer = listing.get(POINTER)
        if pointer is None or pointer.claimed:
            return without_pointer(self, tagged, SERIES,
                                   f"partial: no {POINTER} names it (Megatron writes it once "
                                   "an iteration is complete)")
        pointer.claimed = True
        try:
            text = read_tag(listing, pointer)
            if text != RELEASE and not text.isdigit():
                raise Rejected(f"{POINTER} holds {text[:40]!r}: neither an iteration nor "
                               f"{RELEASE!r}")
        except Rejected as exc:
            return [Candidate(POINTER, pointer, self, "megatron:pointer", reason=exc.reason),
                    *without_pointer(self, tagged, SERIES,
                                     f"{POINTER} cannot be read, so no iteration is known "
                                     "complete")]
        if text == RELEASE:
            return around_pointer(self, listing, pointer, RELEASE, listing.get(RELEASE), None,
                                  tagged, SERIES)
        iteration = int(text)
        # Megatron names it iter_{:07d}; a hand-made iter_5 counts as the same iteration.
        same = [e for e, n in tagged if n == iteration and not e.temp]
        padded = f"iter_{iteration:07d}"
        target = next((e for e in same if e.name == padded), same[0] if same else None)
        return around_pointer(self, listing, pointer, target.name if target else padded, target,
                              iteration, tagged, SERIES)

    def inspect(self, candidate: Candidate, path: str, st: os.stat_result,
                ctx: Context) -> float:
        if os.path.lexists(os.path.join(path, DCP_MARKER)):  # a torch_dist checkpoint
            return max(st.st_mtime, check_dcp_folder(path))
        return max(st.st_mtime, check_megatron_iteration(path))


register(Megatron())
