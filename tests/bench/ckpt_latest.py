"""ckpt-latest: ``latest_valid`` among 10,000 Lightning checkpoints, against a bare ``os.scandir``
of the same directory (its floor: discovery must list the directory once). Goal: <= 50 ms.

ckpt-latest-hf and ckpt-latest-dcp: the same among 10,000 HF Trainer ``checkpoint-N``
folders (trainer_state.json + model.safetensors) and 10,000 torch.distributed.checkpoint
``step_N`` folders (a real ``.metadata`` and shard, written once by torch from the
framework venv), the newest cut short in each: the content checks at work.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Callable

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

    def lightning(tmp: str) -> str:
        for step in range(COUNT):
            with open(os.path.join(tmp, f"epoch={step // 1000}-step={step}.ckpt"), "wb") as f:
                f.write(data)
        # The newest is cut short, as when a job dies mid-save: discovery must look at two.
        newest = os.path.join(tmp, f"epoch={(COUNT - 1) // 1000}-step={COUNT - 1}.ckpt")
        os.truncate(newest, len(data) // 2)
        return f"step={COUNT - 2}.ckpt"

    return _measure("ckpt-latest", lightning)


def _safetensors() -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    return struct.pack("<Q", len(header)) + header + bytes(16)


def hf_main() -> int:
    weights = _safetensors()

    def hf(tmp: str) -> str:
        for step in range(1, COUNT + 1):
            folder = os.path.join(tmp, f"checkpoint-{step}")
            os.mkdir(folder)
            with open(os.path.join(folder, "model.safetensors"), "wb") as f:
                f.write(weights)
            with open(os.path.join(folder, "trainer_state.json"), "w") as f:
                f.write(f'{{"global_step": {step}}}\n')
        os.truncate(os.path.join(tmp, f"checkpoint-{COUNT}", "model.safetensors"),
                    len(weights) - 4)
        return f"checkpoint-{COUNT - 1}"

    return _measure("ckpt-latest-hf", hf)


FRAMEWORK_PYTHON = "/opt/jobwrap/frameworks/bin/python"
_DCP_WRITER = """import sys, torch, torch.distributed.checkpoint as dcp
dcp.save({"w": torch.arange(64.0), "step": 1}, checkpoint_id=sys.argv[1])
"""


def dcp_main() -> int:
    if not os.access(FRAMEWORK_PYTHON, os.X_OK):
        raise SystemExit(f"ckpt-latest-dcp: {FRAMEWORK_PYTHON} is missing: run tools/bootstrap "
                         "(it makes the framework venv)")

    def dcp(tmp: str) -> str:
        model = os.path.join(tmp, "step_1")
        subprocess.run([FRAMEWORK_PYTHON, "-c", _DCP_WRITER, model], check=True,
                       capture_output=True, timeout=300)
        for step in range(2, COUNT + 1):
            shutil.copytree(model, os.path.join(tmp, f"step_{step}"))
        shard = os.path.join(tmp, f"step_{COUNT}", "__0_0.distcp")
        os.truncate(shard, os.path.getsize(shard) // 2)
        return f"step_{COUNT - 1}"

    return _measure("ckpt-latest-dcp", dcp)


def _measure(name: str, make: Callable[[str], str]) -> int:
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        expected = make(tmp)
        later = time.time() + 60  # every file has settled by then

        def discover() -> float:
            started = time.perf_counter()
            found = latest_valid(tmp, now=later)
            elapsed = time.perf_counter() - started
            if found.latest is None or not found.latest.path.endswith(expected):
                raise SystemExit(f"{name}: wrong answer {found}")
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
    return verdict(name, "ms", subject * 1000, "<=", 50)
