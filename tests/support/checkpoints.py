"""Helpers of the checkpoint discovery tests (synthetic layouts and the real frameworks'
output) that are not set-up: the settled clock, a torch.save-shaped zip, discovery at
that clock, and what it found and skipped by name."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

from wrapper.checkpoints import Discovery, latest_valid

OLD = 1_700_000_000.0  # every file is made this old, so that it has settled ...
NOW = OLD + 3600.0  # ... when discovery looks at NOW


def zip_bytes(payload: bytes = b"weights" * 50, comment: bytes = b"",
              members: int = 2) -> bytes:
    """A zip archive shaped like a torch.save file: ``members`` (>= 1) files in ``archive/``."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", payload)
        for i in range(1, members):
            archive.writestr(f"archive/data/{i}", payload[::-1])
        archive.comment = comment
    return buffer.getvalue()


def find(directory: Path, glob: str | None = None, marker: str | None = None) -> Discovery:
    """Discovery as a requeued job's next attempt sees it: everything written long ago."""
    return latest_valid(directory, glob=glob, marker=marker, now=NOW)


def name_of(found: Discovery) -> str | None:
    return Path(found.latest.path).name if found.latest else None


def reasons(found: Discovery) -> dict[str, str]:
    return {Path(s.path).name: s.reason for s in found.skipped}
