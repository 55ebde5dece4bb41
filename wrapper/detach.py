"""Start a process that outlives the hook that started it.

A new session, standard streams on /dev/null, no inherited descriptors, working
directory ``/``: slurmd waits for its hook's output pipe to close, so a child that kept
it open would hold the hook (and the job) until the child ended. jobwrap itself is
started isolated (``python -I``: no PYTHON* variables, no user site, and neither the
working directory nor a script's folder on ``sys.path``), so a ``wrapper/`` package or a
``sitecustomize.py`` lying where the hook was started is never imported as root.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence


def jobwrap_argv(*args: str) -> list[str]:
    """The command line that runs ``jobwrap ARGS`` with this interpreter, isolated."""
    return [sys.executable, "-I", "-m", "wrapper", *args]


def spawn(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Start ``argv`` detached, in its own session, from ``/``; returns its pid.

    subprocess uses vfork and exec here (a fraction of forking this interpreter); the
    child outlives us and is adopted by init when we exit.
    """
    proc = subprocess.Popen(
        list(argv), env=dict(env), cwd="/", stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True,
        start_new_session=True)
    proc.returncode = 0  # never waited for: keep Popen's finaliser from warning about it
    return proc.pid


def hook_env(config_source: str) -> dict[str, str]:
    """The environment a detached jobwrap process needs: where Slurm and the config are,
    and which node this is (the config's ``{node}`` paths: its own state folder)."""
    env = {k: v for k, v in os.environ.items()
           if k in ("PATH", "SLURM_CONF", "JOBWRAP_CONFIG", "LANG", "LC_ALL", "TZ",
                    "SLURMD_NODENAME")}
    if config_source != "(defaults)":
        env["JOBWRAP_CONFIG"] = config_source
    return env


def start_release(job_id: str, config_source: str, exclude: Sequence[str] = (), *,
                  running_grace: float | None = None,
                  spawn_with: Callable[[Sequence[str]], object] | None = None) -> None:
    """Start ``jobwrap release JOB`` detached: the requeued job is made eligible as soon as
    it is PENDING, away from ``exclude``. ``spawn_with``: the hooks' injected spawner
    (tests), else a detached process with :func:`hook_env`."""
    argv = jobwrap_argv("release", job_id)
    for node in exclude:
        argv += ["--exclude", node]
    if running_grace is not None:
        argv += ["--running-grace", f"{running_grace:g}"]
    if spawn_with is not None:
        spawn_with(argv)
    else:
        spawn(argv, hook_env(config_source))
