"""torch.distributed.checkpoint: a directory of ``*.distcp`` shards, complete with ``.metadata``.

DCP writes ``.metadata`` last, on the coordinator, after every rank's shards; every
shard it names must be there and long enough (``dcpmeta``). Its
directories have no fixed name, so this fallback layout proposes every directory no
other layout claimed, ordered by the number in its name (``step_100``) or by mtime, and
looks inside only when it gets there: a directory with neither ``.metadata`` nor a
``.distcp`` shard (``logs/``, ``runs/``) is not a checkpoint and is passed over silently.
"""

from __future__ import annotations

import os

from wrapper.checkpoints.dcpmeta import check_dcp_folder
from wrapper.checkpoints.evidence import marker_mtime
from wrapper.checkpoints.layout import Candidate, Context, NotACheckpoint, Rejected, register
from wrapper.checkpoints.listing import Listing
from wrapper.checkpoints.names import numbered

MARKER = ".metadata"


class DistributedCheckpoint:
    name = "dcp"
    tier = 1

    def candidates(self, listing: Listing) -> list[Candidate]:
        found = []
        for entry in listing.unclaimed():
            # A temporary directory is only reported when a layout knows its name; an
            # unnamed one (tmpXXXX/, .cache/) says nothing about checkpoints.
            if entry.temp or not entry.is_dir(listing.real_root):
                continue
            entry.claimed = True
            series, rank, step = numbered(entry.key)
            named = f"dcp:{series}#" if rank is not None else "dcp"
            found.append(Candidate(entry.name, entry, self, named, rank, step, True))
        return found

    def inspect(self, candidate: Candidate, path: str, st: os.stat_result,
                ctx: Context) -> float:
        marker = marker_mtime(os.path.join(path, MARKER))
        if marker is not None:
            return max(st.st_mtime, marker, check_dcp_folder(path))
        with os.scandir(path) as it:
            if any(e.name.endswith(".distcp") for e in it):
                raise Rejected(f"missing {MARKER} (torch.distributed.checkpoint writes it last)")
        raise NotACheckpoint


register(DistributedCheckpoint())
