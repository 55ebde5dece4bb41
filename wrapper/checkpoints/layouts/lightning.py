"""PyTorch Lightning: ``epoch=E-step=S.ckpt``, ``last.ckpt``/``last-vN.ckpt``, ``hpc_ckpt_N.ckpt``.

Each is one ``torch.save`` zip file, complete when its zip end record is there. Under
the DeepSpeed or sharded-FSDP strategies Lightning writes the same names as directories:
those are complete when they hold DeepSpeed's ``latest`` (naming a tag directory that
exists) or torch.distributed.checkpoint's ``.metadata``.

Order: ``step=S`` names by S, ``hpc_ckpt_N`` by N, ``epoch=E`` names (no step) by E and
``last*`` by mtime; the families are merged by mtime, so a ``last.ckpt`` saved after the
newest ``step=`` file wins, as in Lightning's own ``ckpt_path="last"``.
"""

from __future__ import annotations

import os
import re
import stat

from wrapper.checkpoints.dcpmeta import DCP_MARKER, check_dcp_folder
from wrapper.checkpoints.evidence import check_zip, marker_mtime, read_pointer
from wrapper.checkpoints.layout import Candidate, Context, Rejected, register
from wrapper.checkpoints.listing import Listing
from wrapper.checkpoints.tagcheck import check_deepspeed_tag

_STEP = re.compile(r"step=(\d+)")
_EPOCH = re.compile(r"epoch=(\d+)")
_LAST = re.compile(r"last(?:-v\d+)?\.ckpt")
_HPC = re.compile(r"hpc_ckpt_(\d+)\.ckpt")


class Lightning:
    name = "lightning"
    tier = 0

    def candidates(self, listing: Listing) -> list[Candidate]:
        found = []
        step_in = _STEP.search  # bound once: this loop runs for every file in the directory
        for entry in listing.unclaimed(dotted=True):
            key = entry.key
            if not key.endswith(".ckpt"):
                continue
            if match := step_in(key):
                step = int(match[1])
                found.append(Candidate(entry.name, entry, self, "lightning:step", step, step,
                                       None))
            elif _LAST.fullmatch(key):
                found.append(Candidate(entry.name, entry, self, "lightning:last", None, None,
                                       None))
            elif match := _HPC.fullmatch(key):
                found.append(Candidate(entry.name, entry, self, "lightning:hpc", int(match[1]),
                                       None, None))
            elif match := _EPOCH.search(key):
                found.append(Candidate(entry.name, entry, self, "lightning:epoch",
                                       int(match[1]), None, None))
            else:
                continue  # another *.ckpt: a plain torch file, if nothing else claims it
            entry.claimed = True
        return found

    def inspect(self, candidate: Candidate, path: str, st: os.stat_result,
                ctx: Context) -> float:
        if not stat.S_ISDIR(st.st_mode):
            return check_zip(path)
        metadata = marker_mtime(os.path.join(path, DCP_MARKER))
        if metadata is not None:
            return max(st.st_mtime, metadata, check_dcp_folder(path))
        latest = os.path.join(path, "latest")
        if marker_mtime(latest) is None:
            raise Rejected("checkpoint directory without DeepSpeed's 'latest' or a sharded "
                           "checkpoint's '.metadata': incomplete")
        tag = read_pointer(latest)
        if "/" in tag or tag in (".", "..") or not os.path.isdir(os.path.join(path, tag)):
            raise Rejected(f"'latest' names tag {tag!r}, which is not a directory in it")
        return max(st.st_mtime, os.lstat(latest).st_mtime,
                   check_deepspeed_tag(os.path.join(path, tag)))


register(Lightning())
