"""Hugging Face Trainer: ``checkpoint-N/`` directories, complete once ``trainer_state.json`` is in.

The Trainer writes ``trainer_state.json`` after the model, optimizer and scheduler, so
its presence is the completion marker; since a crash (or a node losing its page cache)
can still leave a weight file cut short beneath it, every weight file the checkpoint
needs (one file, or every shard its index names) and every state file beside it is
checked by its header too (``hfweights``). Ordered by N, the global step.
"""

from __future__ import annotations

import os
import re

from wrapper.checkpoints.evidence import marker_mtime
from wrapper.checkpoints.hfweights import check_weights_dir, entry_names
from wrapper.checkpoints.layout import Candidate, Context, Rejected, register
from wrapper.checkpoints.listing import Listing

_NAME = re.compile(r"checkpoint-(\d+)")
MARKER = "trainer_state.json"


class HuggingFace:
    name = "hf"
    tier = 0

    def candidates(self, listing: Listing) -> list[Candidate]:
        found = []
        for entry in listing.unclaimed(dotted=False):
            if entry.key.startswith("checkpoint-") and (match := _NAME.fullmatch(entry.key)):
                step = int(match.group(1))
                entry.claimed = True
                found.append(Candidate(entry.name, entry, self, "hf", step, step, True))
        return found

    def inspect(self, candidate: Candidate, path: str, st: os.stat_result,
                ctx: Context) -> float:
        marker = marker_mtime(os.path.join(path, MARKER))
        if marker is None:
            raise Rejected(f"missing {MARKER} (the Trainer writes it last)")
        return max(st.st_mtime, marker, check_weights_dir(path, entry_names(path)))


register(HuggingFace())
