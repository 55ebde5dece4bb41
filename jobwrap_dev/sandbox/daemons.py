"""The sandbox's own processes, and its one error.

A daemon the sandbox started is remembered with its start time (``Daemon``), so that it
is signalled only while that pid is still the process it started, never a reused pid;
``cluster`` starts Slurm's daemons and ``accounting`` MariaDB and slurmdbd this way.
"""

from __future__ import annotations

from wrapper.errors import JobwrapError
from wrapper.fastdataclass import dataclass


class SandboxError(JobwrapError):
    """The sandbox cluster could not be set up, started or used."""


@dataclass
class Daemon:
    name: str
    pid: int
    started: float  # psutil create_time, to never signal a reused pid


def daemon_of(name: str, pid: int) -> Daemon:
    import psutil

    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        started = 0.0
    return Daemon(name, pid, started)


def alive(daemon: Daemon) -> bool:
    import psutil

    try:
        proc = psutil.Process(daemon.pid)
        # the same process when it started within a second of ours: psutil adds the boot
        # time, which the kernel reports in whole seconds of a clock NTP slews, so the
        # same process's create_time can move by 1 s (seen: both tiers' daemons "gone" at
        # once, mid-run); a pid reused within a second of the first start is not a case
        return bool(abs(proc.create_time() - daemon.started) < 1.5
                    and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def terminate(daemon: Daemon, grace: float = 10) -> str:
    """SIGTERM, then SIGKILL after ``grace`` seconds; only if the pid is still ours.
    Returns the signal that ended it, "" when it was not running."""
    import psutil

    if not alive(daemon):
        return ""
    proc = psutil.Process(daemon.pid)
    proc.terminate()
    try:
        proc.wait(grace)
    except psutil.TimeoutExpired:
        proc.kill()
        proc.wait(5)
        return "SIGKILL"
    return "SIGTERM"
