"""Plain ``torch.save`` files (``*.pt``, ``*.pth``, ``*.bin``, ``*.ckpt`` no other layout took).

``torch.save`` writes a zip archive; a cut one lacks its end record (see ziptail). The
number in the name orders files of one prefix (``model_100.pt`` < ``model_200.pt``);
names without a number, and different prefixes, are ordered by mtime.
"""

from __future__ import annotations

import os

from wrapper.checkpoints.evidence import check_zip
from wrapper.checkpoints.layout import Candidate, Context, register
from wrapper.checkpoints.listing import Listing
from wrapper.checkpoints.names import numbered

SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
# Written with torch.save beside checkpoints, but never one: Hugging Face's pickled
# TrainingArguments would otherwise win whenever it is the newest file.
NEVER = frozenset({"training_args.bin"})


class TorchSave:
    name = "torch"
    tier = 1

    def candidates(self, listing: Listing) -> list[Candidate]:
        found = []
        for entry in listing.unclaimed(dotted=True):
            key = entry.key
            if not key.endswith(SUFFIXES) or key in NEVER:
                continue
            entry.claimed = True
            series, rank, step = numbered(key.rpartition(".")[0])
            named = f"torch:{series}#" if rank is not None else "torch"
            found.append(Candidate(entry.name, entry, self, named, rank, step))
        return found

    def inspect(self, candidate: Candidate, path: str, st: os.stat_result,
                ctx: Context) -> float:
        return check_zip(path)


register(TorchSave())
