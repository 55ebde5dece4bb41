"""The epilog decision matrix's table, which is not set-up: the job id, the restart limit
and how an attempt of each class ends. The set-up that writes such an attempt is the
``epilog_case`` fixture (and ``job_files`` beneath it) in tests/unit/conftest.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from wrapper.config import Config
from wrapper.job.record import JobRecord
from wrapper.job.state import JobState
from wrapper.slurm.context import JobContext
from wrapper.slurm.fake import FakeSlurm

JOB = "77"
MAX_RESTARTS = 3
# class -> how the attempt ends: (exit code, Slurm JobState, output tail, extra setup)
CASES: dict[str, tuple[int, str, str, str]] = {
    "success": (0, "COMPLETED", "done\n", ""),
    "hardware": (1, "FAILED", "", "gpu_check_failed"),
    "node_failure": (1, "NODE_FAIL", "", ""),
    "hang": (137, "FAILED", "", "hang_fact"),
    "collective_timeout": (1, "FAILED", "NCCL watchdog: collective operation timed out\n",
                           ""),
    "killed": (137, "FAILED", "srun: error: n2: task 1: Killed\n", ""),
    "cuda_oom": (1, "FAILED", "torch.OutOfMemoryError: CUDA out of memory\n", ""),
    "host_oom": (1, "OUT_OF_MEMORY", "", ""),
    "walltime": (0, "TIMEOUT", "", ""),
    "preempted": (0, "PREEMPTED", "", ""),
    "cancelled": (0, "CANCELLED", "", ""),
    "staging": (1, "FAILED", "", "staging_failed"),
    # Slurm ran no prolog on n1 for the attempt; the task-prolog ended it there
    "unchecked": (1, "FAILED", f"jobwrap: job {JOB} did not start on n1\n", "prolog_skipped"),
    "user_error": (1, "FAILED", "ValueError: bad input\n", ""),
}

# The types of the job_files and epilog_case fixtures.
JobFiles = Callable[[Path, str, str, dict[str, object]], tuple[Config, JobState, JobRecord]]
EpilogCase = Callable[[Path, str, str, bool],
                      tuple[JobContext, Config, JobState, JobRecord, FakeSlurm, bool]]
