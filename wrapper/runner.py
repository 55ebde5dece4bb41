"""The one gateway for external commands: argv lists, a mandatory timeout, typed errors.

A command that outlives its timeout is killed with its whole process group, so a hung
``scontrol`` can never keep a hook past Slurm's PrologEpilogTimeout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

from wrapper.errors import CommandError, CommandTimeout
from wrapper.fastdataclass import dataclass


@dataclass(frozen=True)
class Result:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str


class Runner:
    """Runs commands; pass an instance to whatever needs to run one (tests pass their own)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = dict(env) if env is not None else None

    def run(self, argv: Sequence[str], *, timeout: float, input: str | None = None,
            check: bool = True, cwd: str | None = None) -> Result:
        args = [str(a) for a in argv]
        try:
            proc = subprocess.Popen(
                args, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                # Output is not ours to trust (a job's script, a user's --comment): a
                # byte that is not UTF-8 becomes a lone surrogate, never an exception.
                encoding="utf-8", errors="surrogateescape",
                env=self.env, start_new_session=True, cwd=cwd,
            )
        except FileNotFoundError:
            raise CommandError(args, "was not found (is it installed and on PATH, "
                               "or set its path in the config?)") from None
        except PermissionError:
            raise CommandError(args, "is not executable") from None
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            raise CommandTimeout(args, f"timed out after {timeout:g} s", err) from None
        result = Result(args, proc.returncode, out, err)
        if check and proc.returncode != 0:
            raise CommandError(args, f"failed with exit code {proc.returncode}", err)
        return result


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
