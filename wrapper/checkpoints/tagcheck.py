"""What a DeepSpeed tag folder or a Megatron iteration folder must hold to be loadable.

DeepSpeed (``global_stepN/``): model states for every model-parallel rank
(``mp_rank_MM_model_states.pt``, or ``zero_pp_rank_D_mp_rank_MM_model_states.pt``
under ZeRO-3) and, under ZeRO, optimizer shards ``[bf16_]zero_pp_rank_D_mp_rank_MM_
optim_states.pt`` for every data-parallel rank D of every MM. Megatron-LM
(``iter_NNNNNNN/``): one ``mp_rank_TT[_PPP]/`` folder for every tensor (and pipeline)
rank, each with its ``model_optim_rng.pt``; a ``torch_dist`` checkpoint is a
torch.distributed.checkpoint folder instead. Neither format records the world sizes
outside its pickles, so "every rank" means every rank from 0 to the highest one present;
each file found is checked by its zip header.
"""

from __future__ import annotations

import os
import re
import stat

from wrapper.checkpoints.content import check_file
from wrapper.checkpoints.hfweights import entry_names
from wrapper.checkpoints.layout import Rejected
from wrapper.checkpoints.ranks import missing_ranks

_DS_MODEL = re.compile(r"(?:zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt")
_DS_OPTIM = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt")
_MEGATRON_RANK = re.compile(r"mp_rank_(\d+)(?:_(\d+))?")
MEGATRON_FILE = "model_optim_rng.pt"
MEGATRON_DIST_OPTIM = "distrib_optim.pt"


def check_deepspeed_tag(path: str) -> float:
    names = entry_names(path)
    model = [(m, n) for n in names if (m := _DS_MODEL.fullmatch(n))]
    if not model:
        raise Rejected("no mp_rank_*_model_states.pt in it")
    mp = {int(m.group(2)) for m, _ in model}
    gap = missing_ranks(mp)
    if gap is not None:
        raise Rejected(f"missing the model states of model-parallel rank {gap}")
    optim: dict[int, set[int]] = {}
    for n in names:
        if m := _DS_OPTIM.fullmatch(n):
            optim.setdefault(int(m.group(2)), set()).add(int(m.group(1)))
    if optim:
        dp = set().union(*optim.values())
        for rank in sorted(mp):
            have = optim.get(rank, set())
            lacking = missing_ranks(dp | have) if have else 0
            if lacking is None and have != dp:
                lacking = min(dp - have)
            if lacking is not None:
                raise Rejected(f"missing the optimizer shard of data-parallel rank {lacking} "
                               f"for model-parallel rank {rank}")
    newest = 0.0
    for n in sorted(names):
        if _DS_MODEL.fullmatch(n) or _DS_OPTIM.fullmatch(n):
            newest = max(newest, check_file(os.path.join(path, n)))
    return newest


def check_megatron_iteration(path: str) -> float:
    names = entry_names(path)
    ranks = [(int(m.group(1)), int(m.group(2) or 0), n)
             for n in names if (m := _MEGATRON_RANK.fullmatch(n))]
    if not ranks:
        raise Rejected("no mp_rank_* folder in it")
    tp = {t for t, _, _ in ranks}
    pp = {p for _, p, _ in ranks}
    for t in sorted(tp):
        gap = missing_ranks(tp)
        if gap is not None:
            raise Rejected(f"missing mp_rank_{gap:02d}: tensor-parallel rank {gap}")
        have = {p for tt, p, _ in ranks if tt == t}
        if have != pp or missing_ranks(pp) is not None:
            lacking = min(set(range(max(pp) + 1)) - have)
            raise Rejected(f"missing mp_rank_{t:02d}_{lacking:03d}: pipeline rank {lacking}")
    newest = 0.0
    for _, _, n in sorted(ranks):
        folder = os.path.join(path, n)
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            raise Rejected(f"{n} is not a folder (a symlink is not followed)")
        inside = entry_names(folder)
        if MEGATRON_FILE not in inside:
            raise Rejected(f"{n}/ has no {MEGATRON_FILE}")
        for name in (MEGATRON_FILE, MEGATRON_DIST_OPTIM):
            if name in inside:
                newest = max(newest, check_file(os.path.join(folder, name)))
    return newest
