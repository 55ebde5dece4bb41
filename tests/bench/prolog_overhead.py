"""prolog-overhead: `jobwrap prolog` on a healthy node with nothing to stage, against the
import floor of its own stack (`python3 -c "import click, structlog"`). Goal: <= 1.5x."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from tests.bench.timing import alternate, time_command, verdict


def main() -> int:
    bindir = Path(sys.executable).parent
    jobwrap = bindir / "jobwrap"
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.toml"
        config.write_text(f'[paths]\nstate_dir = "{tmp}/state"\n'
                          f'[log]\nfile = "{tmp}/jobwrap.log"\n')
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "JOBWRAP_CONFIG": str(config), "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
            "SLURM_JOB_ID": "1000", "SLURM_JOB_USER": "root", "SLURM_JOB_UID": "0",
            "SLURM_JOB_GID": "0", "SLURMD_NODENAME": "n1", "SLURM_NODELIST": "n1",
            "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
            "SLURM_JOB_RESTART_COUNT": "0",
        }
        counter = iter(range(1000, 10**6))

        def prolog() -> float:
            # a new job id each run: every prolog creates its job's state, as in production
            return time_command([str(jobwrap), "prolog"],
                                {**env, "SLURM_JOB_ID": str(next(counter))})

        def floor() -> float:
            return time_command([sys.executable, "-c", "import click, structlog"], env)

        subject, anchor = alternate(prolog, floor)
    print(f"prolog median {subject * 1000:.1f} ms, import floor median {anchor * 1000:.1f} ms")
    return verdict("prolog-overhead", "ratio", subject / anchor, "<=", 1.5)
