"""Accelerate ``save_state``: ``checkpoint_N/`` folders (``automatic_checkpoint_naming``).

With ``ProjectConfiguration(automatic_checkpoint_naming=True)`` Accelerate saves into
``<project_dir>/checkpoints/checkpoint_N`` (N counts saves, it is not a step); discovery
descends into ``checkpoints/`` when it is given the project folder. A folder is complete
when it holds the model's weights (``model*.safetensors`` or ``pytorch_model*.bin``),
the random states of every process (``random_states_0.pkl`` .. ``random_states_{P-1}``,
written last) and every state file beside them (``optimizer*.bin``, ``scheduler*.bin``,
``sampler*.bin``, ``scaler.pt``, ``custom_checkpoint_*.pkl``) checks by its header.
"""

from __future__ import annotations

import os
import re

from wrapper.checkpoints.hfweights import check_weights_dir, entry_names
from wrapper.checkpoints.layout import Candidate, Context, Rejected, register
from wrapper.checkpoints.listing import Listing
from wrapper.checkpoints.ranks import missing_ranks

_NAME = re.compile(r"checkpoint_(\d+)")
_MODEL = re.compile(r"(?:model|pytorch_model)(?:_\d+)?\.(?:safetensors|bin)")
_RANDOM = re.compile(r"random_states_(\d+)\.pkl")


class Accelerate:
    name = "accelerate"
    tier = 0

    def candidates(self, listing: Listing) -> list[Candidate]:
        found = []
        for entry in listing.unclaimed(dotted=False):
            if entry.key.startswith("checkpoint_") and (match := _NAME.fullmatch(entry.key)):
                entry.claimed = True
                found.append(Candidate(entry.name, entry, self, "accelerate",
                                       int(match.group(1)), None, True))
        return found

    def inspect(self, candidate: Candidate, path: str, st: os.stat_result,
                ctx: Context) -> float:
        names = entry_names(path)
        if not any(_MODEL.fullmatch(n) for n in names):
            raise Rejected("no model weights (model.safetensors or pytorch_model.bin)")
        ranks = [int(m.group(1)) for n in names if (m := _RANDOM.fullmatch(n))]
        if not ranks:
            raise Rejected("missing random_states_0.pkl (Accelerate writes the random "
                           "states last)")
        gap = missing_ranks(ranks)
        if gap is not None:
            raise Rejected(f"missing random_states_{gap}.pkl of process {gap}")
        return max(st.st_mtime, check_weights_dir(path, names, need_model=False))


register(Accelerate())
