"""Which Slurm the sandbox runs: Debian's (22.05, on PATH) or one built into a prefix.

``JOBWRAP_SLURM_PREFIX=/opt/slurm-25.11`` (tools/bootstrap-slurm25 builds it) makes the
sandbox, the e2e tier and the demo run that Slurm's daemons and commands, and the hooks
it installs call that Slurm's commands by absolute path. Unset or empty: Debian's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from wrapper.errors import JobwrapError

PREFIX_VARIABLE = "JOBWRAP_SLURM_PREFIX"
CLIENTS = ("scontrol", "sinfo", "squeue", "scancel")


class FlavorError(JobwrapError):
    """The Slurm asked for is not there."""


def prefix_from_env(env: Mapping[str, str] | None = None) -> str:
    """The Slurm prefix the environment asks for ("" for Debian's), checked to hold one."""
    prefix = (os.environ if env is None else env).get(PREFIX_VARIABLE, "").strip()
    if not prefix:
        return ""
    if not (Path(prefix) / "sbin" / "slurmctld").is_file():
        raise FlavorError(f"{PREFIX_VARIABLE}={prefix} holds no sbin/slurmctld: build it with "
                          "`JOBWRAP_SLURM25=1 bash tools/bootstrap`, or unset "
                          f"{PREFIX_VARIABLE} to use Debian's Slurm")
    return str(Path(prefix).resolve())


def program(prefix: str, name: str) -> str:
    """The daemon or command ``name`` of this Slurm (a bare name: found on PATH)."""
    if not prefix:
        return name
    sub = "sbin" if name.startswith(("slurmctld", "slurmd", "slurmdbd")) else "bin"
    return str(Path(prefix) / sub / name)


def client_env(prefix: str, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with this Slurm's commands first on PATH."""
    out = dict(env)
    if prefix:
        out["PATH"] = f"{prefix}/bin:{prefix}/sbin:{env.get('PATH', '/usr/bin:/bin')}"
    return out


def slurm_section(prefix: str) -> str:
    """Lines of the jobwrap config's ``[slurm]`` table naming this Slurm's commands."""
    if not prefix:
        return ""
    return "".join(f'{name}_command = "{program(prefix, name)}"\n' for name in CLIENTS)


def version(prefix: str) -> tuple[int, int]:
    """(MAJOR, MINOR) of this Slurm, from ``slurmctld -V``; (0, 0) when it cannot say."""
    import re
    import subprocess

    try:
        out = subprocess.run([program(prefix, "slurmctld"), "-V"], capture_output=True,
                             text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return (0, 0)
    match = re.search(r"(\d+)\.(\d+)\.\d+", out)
    return (int(match[1]), int(match[2])) if match else (0, 0)


# Slurm 23.x without accounting storage: slurmctld hands assoc_mgr_init a stale errno
# (a missing state file's ENOENT) as "the database connection failed" (controller.c
# ctld_assoc_mgr_init; 24.11 zeroes errno first), so its association lists stay empty and
# its main scheduler refuses every job as InvalidAccount: only the backfill scheduler,
# every bf_interval (30 s), starts jobs. Seen on 23.11.11 (tools/compat, docs/compat.md).
STALE_ERRNO_SCHEDULER = "bf_interval=1"


def scheduler_workaround(prefix: str, accounting: bool) -> str:
    """A SchedulerParameters item this Slurm's sandbox needs to start jobs within seconds
    ("" none), with why: see STALE_ERRNO_SCHEDULER."""
    if accounting or version(prefix)[0] != 23:
        return ""
    return STALE_ERRNO_SCHEDULER


def pyslurm_wheel(prefix: str) -> Path | None:
    """The pyslurm wheel built against this Slurm (tools/bootstrap-slurm25), if any."""
    if not prefix:
        return None
    wheels = sorted((Path(prefix) / "wheels").glob("pyslurm-*.whl"))
    return wheels[-1] if wheels else None


# slurmctld RPCs jobwrap itself may make (queries and updates), as sdiag names them.
JOBWRAP_RPCS = ("REQUEST_JOB_INFO", "REQUEST_JOB_INFO_SINGLE", "REQUEST_BATCH_SCRIPT",
                "REQUEST_NODE_INFO", "REQUEST_NODE_INFO_SINGLE", "REQUEST_JOB_STEP_INFO",
                "REQUEST_UPDATE_JOB", "REQUEST_UPDATE_NODE", "REQUEST_JOB_REQUEUE",
                "REQUEST_KILL_JOB", "REQUEST_CANCEL_JOB_STEP")


def rpc_counts(sdiag: str) -> dict[str, int]:
    """sdiag's "statistics by message type": RPC name -> count since slurmctld started."""
    import re

    out: dict[str, int] = {}
    section = False
    for line in sdiag.splitlines():
        if "by message type" in line:
            section = True
            continue
        if section and ("by user" in line or "Pending RPC" in line):
            break
        match = re.match(r"^\s*(\w+)\s+\(\s*\d+\)\s+count:(\d+)", line)
        if section and match:
            out[match.group(1)] = int(match.group(2))
    return out


def rpc_delta(before: Mapping[str, int], after: Mapping[str, int],
              names: tuple[str, ...] = JOBWRAP_RPCS) -> dict[str, int]:
    """The RPCs of ``names`` made between two rpc_counts, those that were made only."""
    delta = {n: after.get(n, 0) - before.get(n, 0) for n in names}
    return {n: d for n, d in delta.items() if d}
