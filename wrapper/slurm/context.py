"""The job context a hook runs in, read from the environment Slurm gives it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, field
from typing import Any

from wrapper.errors import NotUnderSlurm
from wrapper.fastdataclass import dataclass
from wrapper.slurm.parse import expand_hostlist, parse_exit_pair, parse_index_list

HOOKS = ("prolog", "epilog", "task-prolog")
EXTRA_TAG = "jobwrap:1"  # job_submit.lua's mark on the Extra it wrote
EXTRA_MOST = 4096  # bytes of Extra job_submit.lua writes at most; more is none of ours
UNLIMITED_AFTER = 365 * 86400  # an end this far past the start: Slurm's "no time limit"
_PATTERN = re.compile(r"%(\d{0,3})(.)", re.S)
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
    # Slurm 23.02+ hands the prolog and epilog these too (22.05 does not): epoch seconds,
    # and the job's Extra, where job_submit.lua keeps its directives (EXTRA_TAG).
    start_time: int | None = None
    end_time: int | None = None
    extra: str = ""

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
        start_time=_int_or_none(env.get("SLURM_JOB_START_TIME")),
        end_time=_int_or_none(env.get("SLURM_JOB_END_TIME")),
        extra=env.get("SLURM_JOB_EXTRA", "")[:EXTRA_MOST],
    )


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text not in (None, "") else None
    except ValueError:
        return None


def known_script(ctx: JobContext) -> str | None:
    """The script lines job_submit.lua kept in the job's Extra (#JOBWRAP and #SBATCH
    --signal lines, one a line), or None where Extra holds none of ours.

    Extra is the user's to rewrite (``scontrol update JobId=.. Extra=..``), so this is
    user input exactly like the script: the caller parses it with the script's own rules
    and bounds (``directives.parse_script``), and it decides nothing but the job's own
    options.
    """
    text = ctx.extra
    if text != EXTRA_TAG and not text.startswith(EXTRA_TAG + " "):
        return None
    from urllib.parse import unquote_to_bytes

    raw = unquote_to_bytes(text[len(EXTRA_TAG) + 1:])
    return raw.decode("utf-8", "surrogateescape").replace("\r", "").replace("\x00", "")


def known_info(ctx: JobContext) -> dict[str, str] | None:
    """The fields of Slurm's job record the prolog needs (WorkDir, StdOut, StdErr,
    TimeLimit, StartTime, as ``scontrol show job`` prints them) where the hook's
    environment carries them all (Slurm 23.02+), else None: then ask slurmctld."""
    if ctx.start_time is None or ctx.end_time is None or not ctx.work_dir or not ctx.stdout:
        return None
    out = [_expand(p, ctx) for p in (ctx.stdout, ctx.stderr or ctx.stdout)]
    if out[0] is None or out[1] is None:
        return None
    from datetime import datetime

    span = ctx.end_time - ctx.start_time
    if span <= 0 or span >= UNLIMITED_AFTER:
        limit = "UNLIMITED"
    else:
        days, rest = divmod(span, 86400)
        limit = f"{days}-{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return {"WorkDir": ctx.work_dir, "StdOut": out[0], "StdErr": out[1], "TimeLimit": limit,
            "StartTime": datetime.fromtimestamp(ctx.start_time).isoformat(timespec="seconds")}


def _expand(pattern: str, ctx: JobContext) -> str | None:
    """A --output pattern as sbatch expands it, for %j %u %N %%; None for any other
    (%x, %A, %a ...: only slurmctld knows those)."""
    import os

    if "\\" in pattern:  # Slurm: a backslash turns expansion off, and is removed
        text: str | None = pattern.replace("\\", "")
    else:
        values = {"j": ctx.job_id, "u": ctx.user, "N": ctx.nodes[0] if ctx.nodes else ctx.node,
                  "%": "%"}
        unknown = False

        def one(match: re.Match[str]) -> str:
            nonlocal unknown
            value = values.get(match.group(2))
            if value is None:
                unknown = True
                return ""
            width = int(match.group(1) or 0)
            return value.zfill(width) if match.group(2) == "j" else value

        text = _PATTERN.sub(one, pattern)
        if unknown:
            text = None
    if text is None:
        return None
    return text if os.path.isabs(text) else os.path.join(ctx.work_dir, text)
