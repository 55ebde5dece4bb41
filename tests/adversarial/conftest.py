"""The adversarial tier: an ordinary cluster user attacks a root hook or slurmctld.

Every test here plays one attack as that user (the sandbox's test user, or ``rival``,
a second user who shares the test user's primary group) against the real sandbox Slurm,
or runs a hook exactly as slurmd runs it (``run_as_slurmd``), and asserts what an admin
relies on: the controller answers, no node drains, root decides from its own facts,
nothing leaks, nothing is lost.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from jobwrap_dev.sandbox import flavor
from jobwrap_dev.sandbox.cluster import Cluster
from wrapper.osl.users import UserIds

RIVAL = "jwrival"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.adversarial)


@pytest.fixture(scope="session")
def rival(cluster: Cluster) -> UserIds:
    """A second ordinary user whose primary group is the test user's primary group."""
    victim = pwd.getpwnam(cluster.spec.user)
    try:
        pwd.getpwnam(RIVAL)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--gid", str(victim.pw_gid), RIVAL],
                       check=True)
    entry = pwd.getpwnam(RIVAL)
    assert entry.pw_gid == victim.pw_gid, f"{RIVAL} must share {cluster.spec.user}'s group"
    return UserIds.of(entry.pw_uid, entry.pw_gid)


@contextlib.contextmanager
def rival_claiming(rival: UserIds, job_id: str, node: str, rank: int,
                   argv: list[str]) -> Iterator[set[int]]:
    """The rival's process ``argv`` (run from /tmp) whose environment claims to be rank
    ``rank`` of the job on ``node``, for the block; yields its pids (those this test
    started, killed at the end)."""
    forger = subprocess.Popen(["runuser", "-u", rival.name, "--", "env",
                               f"SLURM_JOB_ID={job_id}", f"SLURMD_NODENAME={node}",
                               f"RANK={rank}", *argv], cwd="/tmp")
    forged: set[int] = set()
    try:
        time.sleep(1)
        with contextlib.suppress(psutil.Error):
            forged = {c.pid for c in psutil.Process(forger.pid).children(recursive=True)}
        yield forged
    finally:
        with contextlib.suppress(psutil.Error):
            for pid in forged:
                psutil.Process(pid).kill()
        forger.kill()
        forger.wait()


@dataclass
class HookRun:
    rc: int
    stdout: str
    stderr: str
    seconds: float


def slurmd_env(cluster: Cluster, hook: str, job_id: str, *, node: str = "n1",
               user: str | None = None, **extra: str) -> dict[str, str]:
    """The bare environment slurmd gives a Prolog/Epilog (see prolog_epilog.shtml)."""
    entry = pwd.getpwnam(user or cluster.spec.user)
    env = {"SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id, "SLURM_JOB_USER": entry.pw_name,
           "SLURM_JOB_UID": str(entry.pw_uid), "SLURM_JOB_GID": str(entry.pw_gid),
           "SLURMD_NODENAME": node, "SLURM_NODELIST": node, "SLURM_JOB_NODELIST": node,
           "SLURM_CLUSTER_NAME": "sandbox", "SLURM_CONF": str(cluster.conf),
           "SLURM_SCRIPT_CONTEXT": f"{hook}_slurmd", "SLURM_JOB_PARTITION": "debug"}
    env.update(extra)
    return env


def run_as_slurmd(cluster: Cluster, hook: str, env: Mapping[str, str], *,
                  timeout: float = 120) -> HookRun:
    """Run the installed hook executable (``prolog``/``epilog``) as slurmd does: as
    root, from /, with only ``env``. A hook that outlives ``timeout`` fails the test."""
    program = cluster.runtime / hook / hook
    start = time.monotonic()
    proc = subprocess.run([str(program)], env=dict(env), cwd="/", capture_output=True,
                          text=True, timeout=timeout, check=False)
    return HookRun(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def as_user(cluster: Cluster, user: str, argv: list[str], *, timeout: float = 30,
            cwd: str | os.PathLike[str] = "/") -> subprocess.CompletedProcess[str]:
    """``argv`` run by ``user`` (runuser), with the sandbox's Slurm in its environment."""
    # The cluster's own Slurm clients first (a built 25.11's), never Debian's for it.
    path = flavor.client_env(cluster.spec.slurm_prefix, {"PATH": "/usr/local/bin:/usr/bin:/bin"})
    env = {"PATH": path["PATH"], "SLURM_CONF": str(cluster.conf),
           "HOME": pwd.getpwnam(user).pw_dir, "LANG": "C.UTF-8"}
    return subprocess.run(["/usr/sbin/runuser", "-u", user, "--", *argv], env=env, cwd=cwd,
                          capture_output=True, text=True, errors="replace", timeout=timeout,
                          check=False)
