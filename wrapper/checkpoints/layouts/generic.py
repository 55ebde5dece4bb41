"""The generic layout: checkpoints named by a glob, complete when an optional marker exists.

Not auto-detected: discovery uses it, and only it, when a glob is given (``--glob``,
a directive or the config). The rule:

- ``glob`` is one path component (no ``/``), matched with ``fnmatch`` against each name
  in the directory with its temporary affixes removed; a temporary name that matches is
  reported as such, never chosen.
- ``marker``, when given, is a name: a matching *directory* is complete when
  ``<dir>/<marker>`` is a regular file; a matching *file* is complete when
  ``<name><marker>`` is a regular file beside it (``model_5.pt`` + ``.done`` ->
  ``model_5.pt.done``). Names ending with the marker are markers, never candidates.
- A matching file that starts like a zip archive must also have its zip end record.
- Order: the number in the name (among names with the same prefix), else mtime.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat

from wrapper.checkpoints.evidence import check_zip, is_zip, marker_mtime
from wrapper.checkpoints.layout import Candidate, Context, Rejected
from wrapper.checkpoints.listing import Listing
from wrapper.checkpoints.names import numbered
from wrapper.errors import UserInputError


class Generic:
    name = "generic"
    tier = 0

    def __init__(self, glob: str, marker: str | None = None) -> None:
        if not glob or "/" in glob or "\0" in glob or glob in (".", ".."):
            raise UserInputError(f"checkpoint glob {glob!r} must be one non-empty name pattern "
                                 "without '/' (it is matched in the checkpoint directory)")
        if marker is not None and (not marker or "/" in marker or "\0" in marker
                                   or marker in (".", "..")):
            raise UserInputError(f"checkpoint marker {marker!r} must be a file name without '/'")
        self.glob = glob
        self.marker = marker
        self._match = re.compile(fnmatch.translate(glob)).match

    def candidates(self, listing: Listing) -> list[Candidate]:
        found = []
        marker = self.marker
        for entry in listing.unclaimed():
            key = entry.key
            if marker and key.endswith(marker) and key != marker:
                continue
            if not self._match(key):
                continue
            entry.claimed = True
            series, rank, step = numbered(os.path.splitext(key)[0])
            named = f"generic:{series}#" if rank is not None else "generic"
            found.append(Candidate(entry.name, entry, self, named, rank, step, None))
        return found

    def inspect(self, candidate: Candidate, path: str, st: os.stat_result,
                ctx: Context) -> float:
        newest = st.st_mtime
        if stat.S_ISDIR(st.st_mode):
            if self.marker:
                found = marker_mtime(os.path.join(path, self.marker))
                if found is None:
                    raise Rejected(f"missing completion marker {self.marker} inside it")
                newest = max(newest, found)
            return newest
        if self.marker:
            beside = candidate.name + self.marker
            found = marker_mtime(os.path.join(ctx.real_root, beside))
            if found is None:
                raise Rejected(f"missing completion marker {beside} beside it")
            newest = max(newest, found)
        if is_zip(path):
            newest = max(newest, check_zip(path))
        return newest
