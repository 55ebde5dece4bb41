"""ckpt-latest: ``latest_valid`` among 10,000 Lightning checkpoints, against a bare ``os.scandir``
of the same directory (its floor: discovery must list the directory once). Goal: <= 50 ms."""

from __future__ import annotations

import io
import os
import tempfile
import time
import zipfile

from tests.bench.timing import alternate, verdict
from wrapper.checkpoints import latest_valid

COUNT = 10_000


def _small_checkpoint() -> bytes:
    """A real zip shaped like a torch.save file, small so that 10,000 are quick to write."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00." * 8)
        archive.writestr("archive/version", b"3\n")
    return buffer.getvalue()


def main() -> int:
    data = _small_checkpoint()
    with tempfile.TemporaryDirectory(prefix="ckpt-latest-") as tmp:
        for step in range(COUNT):
            with open(os.path.join(tmp, f"epoch={step // 1000}-step={step}.ckpt"), "wb") as f:
                f.write(data)
        # The newest is cut short, as when a job dies mid-save: discovery must look at two.
        newest = os.path.join(tmp, f"epoch={(COUNT - 1) // 1000}-step={COUNT - 1}.ckpt")
        os.truncate(newest, len(data) // 2)
        later = time.time() + 60  # every file has settled by then
        expected = f"step={COUNT - 2}.ckpt"

        def discover() -> float:
            started = time.perf_counter()
            found = latest_valid(tmp, now=later)
            elapsed = time.perf_counter() - started
            if found.latest is None or not found.latest.path.endswith(expected):
                raise SystemExit(f"ckpt-latest: wrong answer {found}")
            return elapsed

        def listing() -> float:
            started = time.perf_counter()
            with os.scandir(tmp) as it:
                names = [entry.name for entry in it]
            elapsed = time.perf_counter() - started
            assert len(names) == COUNT
            return elapsed

        subject, anchor = alternate(discover, listing)
    print(f"latest_valid median {subject * 1000:.2f} ms, os.scandir listing median "
          f"{anchor * 1000:.2f} ms ({COUNT} checkpoints)")
    return verdict("ckpt-latest", "ms", subject * 1000, "<=", 50)
