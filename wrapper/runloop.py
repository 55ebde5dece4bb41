"""``jobwrap run [options] -- CMD ...``: restart CMD inside the allocation, no queue wait.

Same options and the same restart policy as the directives: each new attempt gets
``JOBWRAP_ATTEMPT`` and, when a valid checkpoint exists, ``JOBWRAP_RESUME_FROM``.
Signals sent to jobwrap (Slurm's pre-timeout signal, scancel's SIGTERM) are forwarded
to the command's process group; after a SIGTERM or SIGINT there is no restart.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import field
from types import FrameType

from wrapper import log
from wrapper.config import Config
from wrapper.directives import JobOptions
from wrapper.lean import dataclass
from wrapper.restart import resume as resume_mod
from wrapper.restart.classify import Evidence, classify
from wrapper.restart.policy import PastAttempt, decide

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGCONT)
FINAL = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass
class RunState:
    child: subprocess.Popen[bytes] | None = None
    stopping: bool = False
    history: list[PastAttempt] = field(default_factory=list)


class Forwarder:
    """Signal handler as a plain object, so tests call it directly."""

    def __init__(self, state: RunState) -> None:
        self.state = state

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if signum in FINAL:
            self.state.stopping = True
        child = self.state.child
        if child is not None and child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signum)


def run(command: Sequence[str], options: JobOptions, cfg: Config,
        say: Callable[[str], None] | None = None) -> int:
    say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    logger = log.get()
    state = RunState()
    forwarder = Forwarder(state)
    for signum in FORWARDED:
        signal.signal(signum, forwarder)
    max_restarts = resume_mod.max_restarts(options, cfg)
    base_attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    attempt = 0
    while True:
        resume = _latest(options)
        resumes = bool(resume) and (attempt > 0 or base_attempt > 0
                                    or resume_mod.RESUME_FROM in os.environ)
        env = resume_mod.environ(os.environ, resume_mod.exports(
            attempt=base_attempt + attempt, scratch=None,
            checkpoint_dir=os.path.abspath(options.checkpoint_dir)
            if options.checkpoint_dir else None,
            resume_from=resume[0] if resume and resumes else None))
        if attempt > 0:
            say(f"jobwrap run: attempt {attempt}: " + (f"resuming from {resume[0]}" if resume
                and resumes else "starting from the beginning"))
        started = time.monotonic()
        try:
            state.child = subprocess.Popen(list(command), env=env, start_new_session=True)
        except OSError as exc:
            say(f"jobwrap run: cannot start {command[0]!r}: {exc.strerror}")
            return 127
        status = state.child.wait()
        code, sig = (status, 0) if status >= 0 else (0, -status)
        logger.info("run.attempt_end", attempt=attempt, exit_code=code, signal=sig,
                    seconds=round(time.monotonic() - started, 2))
        if state.stopping:
            return status if status >= 0 else 128 + sig
        verdict = classify(Evidence(exit_code=code, exit_signal=sig))
        after = _latest(options)
        decision = decide(verdict, attempt=attempt, max_restarts=max_restarts,
                          no_requeue=options.no_requeue, history=state.history,
                          checkpoint_step=after[1] if after else None,
                          checkpoint_path=after[0] if after else None, node="",
                          no_progress_limit=cfg.restart.no_progress_limit)
        if decision.action == "done":
            return 0
        say(f"jobwrap run: attempt {attempt} ended: {verdict.kind} ({verdict.detail}); "
            + ("restarting in place" if decision.requeue else f"stopping: {decision.reason}"))
        if not decision.requeue:
            return code if code else 128 + sig
        state.history.append(PastAttempt(attempt, verdict.kind, verdict.signature,
                                         after[1] if after else None,
                                         after[0] if after else None))
        attempt += 1


def _latest(options: JobOptions) -> tuple[str, int | None] | None:
    # Only called between attempts, when nothing is writing: no settle time.
    found = resume_mod.latest(options.checkpoint_dir, options)
    return (found.path, found.step) if found else None
