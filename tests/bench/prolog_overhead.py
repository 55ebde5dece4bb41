"""prolog-overhead: `jobwrap prolog` as Slurm runs it, on a healthy node with 8 (fake) GPUs
and nothing to stage, on the real local Slurm, against the import floor of its own stack
(`python3 -c "import click, structlog"` in the same environment). Goal: <= 1.5x."""

from __future__ import annotations

import os
import subprocess

from tests.bench.cluster import sandbox
from tests.bench.timing import alternate, time_command, verdict


def main() -> int:
    with sandbox(gpus_per_node=8) as cluster:
        job_id = cluster.submit("#!/bin/bash\ntrue\n", "--hold", "--gres=gpu:8",
                                name="bench.sh")
        user = cluster.job(job_id)["UserId"]  # jwtest(1001)
        uid = user.split("(")[1].rstrip(")")
        bindir = cluster.runtime / "venv" / "bin"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_CONF": str(cluster.conf),
            "JOBWRAP_CONFIG": str(cluster.jobwrap_config),
            "SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "SLURM_JOB_ID": job_id,
            "SLURM_JOB_USER": cluster.spec.user, "SLURM_JOB_UID": uid, "SLURM_JOB_GID": uid,
            "SLURMD_NODENAME": "n1", "SLURM_NODELIST": "n1", "SLURM_JOB_PARTITION": "debug",
            "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
            "SLURM_JOB_RESTART_COUNT": "0",
        }

        def prolog() -> float:
            return time_command([str(bindir / "jobwrap"), "prolog"], env)

        def floor() -> float:
            return time_command([str(bindir / "python"), "-c", "import click, structlog"], env)

        def bare() -> float:
            return time_command([str(bindir / "python"), "-c", "pass"], env)

        check = subprocess.run([str(bindir / "jobwrap"), "prolog"], env=env, check=False)
        if check.returncode != 0:
            print(f"prolog-overhead: the prolog failed (exit {check.returncode})")
            return 1
        subject, anchor = alternate(prolog, floor)
        _, bare_median = alternate(bare, bare, rounds=5)
        importtime = subprocess.run(
            [str(bindir / "python"), "-X", "importtime", "-m", "wrapper", "prolog"],
            env=env, capture_output=True, text=True, check=False).stderr
    rows = [line.split("|") for line in importtime.splitlines() if line.startswith("import time:")]
    top = sorted(((int(r[1]), r[2].rstrip()) for r in rows if r[1].strip().isdigit()),
                 reverse=True)[:8]
    print("python -X importtime, largest cumulative imports of the prolog (us):")
    for cumulative, name in top:
        print(f"  {cumulative:>8} {name}")
    print(f"prolog median {subject * 1000:.1f} ms, import floor median {anchor * 1000:.1f} ms, "
          f"bare python median {bare_median * 1000:.1f} ms")
    return verdict("prolog-overhead", "ratio", subject / anchor, "<=", 1.5)
