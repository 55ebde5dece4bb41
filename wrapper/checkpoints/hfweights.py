"""The files a Hugging Face ``checkpoint-N/`` needs to load, each checked by its header.

The model's weights are one file (``model.safetensors``, ``pytorch_model.bin``; a PEFT
adapter's ``adapter_model.*``) or the shards an index names (``*.index.json``: its
``weight_map`` maps every tensor to a shard file); a checkpoint with neither cannot be
resumed. Every other state file beside them (``optimizer.pt``, ``scheduler.pt``,
``rng_state*.pth``, ``training_args.bin``) is checked too, since the resume loads them.
Used by the HF layout and by Accelerate's ``save_state`` folders.
"""

from __future__ import annotations

import os

from wrapper.checkpoints.content import check_file, plain_name, read_small
from wrapper.checkpoints.layout import Rejected
from wrapper.osl import jsontext

INDEX_LIMIT = 64 << 20
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl")
_SINGLE = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors",
           "adapter_model.bin")
_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def index_shards(path: str) -> set[str]:
    """The shard files a weights index names; Rejected when it cannot say."""
    name = os.path.basename(path)
    index = jsontext.loads(read_small(path, INDEX_LIMIT), max_bytes=INDEX_LIMIT)
    if index is None:
        raise Rejected(f"{name} is not JSON (cut short?)")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise Rejected(f"{name} has no weight_map")
    shards = set(weight_map.values())
    bad = next((s for s in shards if not plain_name(s)), None)
    if bad is not None:
        raise Rejected(f"{name} names shard {str(bad)[:60]!r}, not a file in the checkpoint")
    return shards


def check_weights_dir(path: str, names: set[str], *, need_model: bool = True) -> float:
    """Check the weights and state files in ``path`` (its entries ``names``); newest mtime."""
    newest = 0.0
    needed: set[str] = set()
    for index in _INDEXES:
        if index in names:
            shards = index_shards(os.path.join(path, index))
            missing = sorted(shards - names)
            if missing:
                raise Rejected(f"{index} names {len(missing)} shard(s) that are missing, "
                               f"e.g. {missing[0]}")
            needed |= shards
    has_model = bool(needed) or any(n in names for n in _SINGLE)
    if need_model and not has_model:
        raise Rejected("no model weights (model.safetensors, pytorch_model.bin or a "
                       "*.index.json with its shards)")
    for name in sorted(names):
        if name.endswith(WEIGHT_SUFFIXES) or name in needed:
            newest = max(newest, check_file(os.path.join(path, name)))
    return newest


def entry_names(path: str) -> set[str]:
    with os.scandir(path) as it:
        return {e.name for e in it}
