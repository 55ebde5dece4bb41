"""Helpers of the hook tests that are not set-up: the fake GPU inventories a test site
names, and the environment slurmd gives a hook."""

from __future__ import annotations

from pathlib import Path

# The fake GPU backend's inventories (``healthy-4.toml``...), for ``[gpu] fake_inventory``.
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"


def slurm_env(hook: str, **extra: str) -> dict[str, str]:
    """What slurmd sets for ``hook`` of job 31 (root's) on n1, GPUs 1 and 3, attempt 1;
    ``extra`` adds or overrides."""
    env = {"SLURM_JOB_ID": "31", "SLURM_JOB_USER": "root", "SLURM_JOB_UID": "0",
           "SLURM_JOB_GID": "0", "SLURMD_NODENAME": "n1", "SLURM_NODELIST": "n1",
           "SLURM_JOB_GPUS": "1,3", "SLURM_JOB_RESTART_COUNT": "1"}
    if hook != "task-prolog":
        env["SLURM_SCRIPT_CONTEXT"] = f"{hook}_slurmd"
    return {**env, **extra}
