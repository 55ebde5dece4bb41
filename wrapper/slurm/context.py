"""The job context a hook runs in, read from the environment Slurm gives it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from wrapper.errors import NotUnderSlurm
from wrapper.slurm.parse import expand_hostlist, parse_exit_pair, parse_index_list

HOOKS = ("prolog", "epilog", "task-prolog")
_JOB_ID = re.compile(r"^[0-9]{1,12}$")


@dataclass(frozen=True)
class JobContext:
    hook: str
    job_id: str
    node: str
    user: str
    uid: int | None
    gid: int | None
    partition: str = ""
    nodes: list[str] = field(default_factory=list)
    gpus: list[int] = field(default_factory=list)
    cuda_visible_devices: str = ""
    attempt: int = 0
    work_dir: str = ""
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    exit_signal: int | None = None

    @property
    def first_node(self) -> bool:
        return not self.nodes or self.nodes[0] == self.node

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def from_env(hook: str, env: Mapping[str, str]) -> JobContext:
    """Build the context of a prolog, epilog or task-prolog from its environment.

    The prolog and epilog see SLURM_JOB_* variables set by slurmd; task-prolog sees the
    job's own environment (SLURM_RESTART_COUNT, USER, SLURM_JOB_NODELIST).
    """
    if hook not in HOOKS:
        raise ValueError(f"unknown hook {hook!r}")
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id:
        raise NotUnderSlurm(f"jobwrap {hook} must be run by Slurm: SLURM_JOB_ID is not set "
                            "(to try it by hand, export SLURM_JOB_ID, SLURMD_NODENAME and "
                            "SLURM_JOB_USER)")
    if not _JOB_ID.match(job_id):
        raise NotUnderSlurm(f"SLURM_JOB_ID={job_id!r} is not a Slurm job id")
    node = env.get("SLURMD_NODENAME") or env.get("SLURM_NODENAME") or ""
    if not node:
        raise NotUnderSlurm(f"jobwrap {hook}: SLURMD_NODENAME is not set")
    nodelist = env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    restarts = env.get("SLURM_JOB_RESTART_COUNT") or env.get("SLURM_RESTART_COUNT") or "0"
    gpus = env.get("SLURM_JOB_GPUS") or env.get("SLURM_STEP_GPUS") or ""
    exit_code = exit_signal = None
    if env.get("SLURM_JOB_EXIT_CODE2"):
        exit_code, exit_signal = parse_exit_pair(env["SLURM_JOB_EXIT_CODE2"])
    return JobContext(
        hook=hook,
        job_id=job_id,
        node=node,
        user=env.get("SLURM_JOB_USER") or env.get("USER") or "",
        uid=_int_or_none(env.get("SLURM_JOB_UID")),
        gid=_int_or_none(env.get("SLURM_JOB_GID")),
        partition=env.get("SLURM_JOB_PARTITION", ""),
        nodes=expand_hostlist(nodelist) if nodelist else [node],
        gpus=parse_index_list(gpus) if gpus else [],
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES", ""),
        attempt=_int_or_none(restarts) or 0,
        work_dir=env.get("SLURM_JOB_WORK_DIR") or env.get("SLURM_SUBMIT_DIR") or "",
        stdout=env.get("SLURM_JOB_STDOUT", ""),
        stderr=env.get("SLURM_JOB_STDERR", ""),
        exit_code=exit_code,
        exit_signal=exit_signal,
    )


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text not in (None, "") else None
    except ValueError:
        return None
