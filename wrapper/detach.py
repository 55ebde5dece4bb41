"""Start a process that outlives the hook that started it.

Double fork in a new session, standard streams on /dev/null, no inherited descriptors:
slurmd waits for its hook's output pipe to close, so a child that kept it open would
hold the hook (and the job) until the child ended.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence


def spawn(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Start ``argv`` detached, in its own session; returns its pid.

    posix_spawn (vfork and exec) costs a fraction of forking this interpreter. Every
    descriptor Python opens is close-on-exec, so only 0-2 could leak: they are pointed
    at /dev/null. The child outlives us and is adopted by init when we exit.
    """
    if hasattr(os, "posix_spawn"):
        actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDWR, 0),
                   (os.POSIX_SPAWN_DUP2, 0, 1), (os.POSIX_SPAWN_DUP2, 0, 2)]
        return os.posix_spawn(argv[0], list(argv), dict(env), file_actions=actions,
                              setsid=True)
    return _double_fork(argv, env)


def _double_fork(argv: Sequence[str], env: Mapping[str, str]) -> int:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            os.setsid()
            grandchild = os.fork()
            if grandchild:
                os.write(write_fd, str(grandchild).encode())
                os._exit(0)
            os.close(write_fd)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.closerange(3, 65536)
            os.chdir("/")
            os.execve(argv[0], list(argv), dict(env))  # noqa: S606 - argv list, no shell
        finally:
            os._exit(127)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        text = pipe.read().decode()
    os.waitpid(pid, 0)
    return int(text) if text.isdigit() else -1


def hook_env(config_source: str) -> dict[str, str]:
    """The environment a detached jobwrap process needs: where Slurm and the config are."""
    env = {k: v for k, v in os.environ.items()
           if k in ("PATH", "SLURM_CONF", "JOBWRAP_CONFIG", "LANG", "LC_ALL", "TZ")}
    if config_source != "(defaults)":
        env["JOBWRAP_CONFIG"] = config_source
    return env
