"""``jobwrap run [options] -- CMD ...``: restart CMD inside the allocation, no queue wait.

Same options and the same restart policy as the directives, whose values it takes
where its own command line gives none: each new attempt gets
``JOBWRAP_ATTEMPT`` and, when a valid checkpoint exists, ``JOBWRAP_RESUME_FROM``.
Signals sent to jobwrap (Slurm's pre-timeout signal, scancel's SIGTERM) are forwarded
to the command's process group; after a SIGTERM or SIGINT there is no restart. Nor is
there when root found a node of the job faulty (a watcher's GPU fault, a drain with
jobwrap's reason, a node Slurm lost): the command's status ends the job, and the
epilog's requeue puts it on healthy nodes.
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
from typing import TYPE_CHECKING

from wrapper import log
from wrapper.config import Config
from wrapper.directives import JobOptions
from wrapper.lean import dataclass
from wrapper.restart import resume as resume_mod
from wrapper.restart.classify import Evidence, classify
from wrapper.restart.policy import PastAttempt, decide

if TYPE_CHECKING:
    from wrapper.slurm import SlurmBackend

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
    options = with_directives(options, cfg)
    max_restarts = resume_mod.max_restarts(options, cfg)
    base_attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    _record_start(cfg, command, base_attempt)
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
        faulty = faulty_nodes(cfg, base_attempt)
        if faulty:  # never restart in place on a node root found faulty: the queue's turn
            where = "; ".join(f"{node}: {why}" for node, why in sorted(faulty.items()))
            say(f"jobwrap run: not restarting in place: a node of the job is faulty ({where}); "
                "ending, so that jobwrap requeues the job away from it")
            return code if code else 128 + sig
        state.history.append(PastAttempt(attempt, verdict.kind, verdict.signature,
                                         after[1] if after else None,
                                         after[0] if after else None))
        attempt += 1


def with_directives(options: JobOptions, cfg: Config) -> JobOptions:
    """``options`` over the job's own ``#JOBWRAP`` directives (root's record of the job):
    a script that wraps its command in ``jobwrap run --`` need not repeat them. Outside a
    job, or without its record, ``options`` alone."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        return options
    from wrapper import jobrecord
    from wrapper.errors import JobwrapError
    from wrapper.state import for_job

    try:
        record = jobrecord.load(for_job(cfg, job_id))
    except (JobwrapError, OSError):
        return options
    # what the command line set (0 restarts is a value; None, () and False are unset)
    given = {k: v for k, v in options.as_dict().items()
             if v is not None and v is not False and v != ()}
    merged = {**record.job_options.as_dict(), **given}
    if "checkpoint_dir" not in given and record.checkpoint_dir:
        merged["checkpoint_dir"] = record.checkpoint_dir  # relative to the job's work dir
    return JobOptions.from_dict(merged)


def faulty_nodes(cfg: Config, attempt: int, backend: SlurmBackend | None = None
                 ) -> dict[str, str]:
    """``{node: why}`` for the job's nodes root found faulty during this attempt: a node
    watcher's fault in root's record here, a node drained with a jobwrap reason, a node
    Slurm lost. Root's and Slurm's facts only; outside a job, or when Slurm cannot be
    asked, nothing (the next attempt's own watchers still follow it)."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        return {}
    from wrapper.errors import JobwrapError
    from wrapper.slurm.parse import expand_hostlist
    from wrapper.slurm.records import node_lost
    from wrapper.state import for_job
    from wrapper.watch.remote import faults_elsewhere, node_records

    try:
        nodes = expand_hostlist(os.environ.get("SLURM_JOB_NODELIST", ""))
        if backend is None:
            from wrapper import slurm

            backend = slurm.backend(cfg.slurm)
        events = for_job(cfg, job_id).events(root_only=True)
        found = faults_elsewhere(backend, nodes, "", attempt, events)
        for node, info in node_records(backend, [n for n in nodes if n not in found], ""):
            if node_lost(info):
                found[node] = f"Slurm lost it ({info.get('State', '')})"
    except (JobwrapError, OSError) as exc:
        log.get().warning("run.faults_unknown", error=str(exc))
        return {}
    return found


def _record_start(cfg: Config, command: Sequence[str], attempt: int) -> None:
    """Note in the job's (the user's) event file that the command runs under ``jobwrap
    run``; outside a Slurm job, or without the job's state folder, nothing."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        return
    from wrapper.errors import JobwrapError
    from wrapper.job import events as ev
    from wrapper.job.store import JobStore

    try:
        JobStore.of(cfg, job_id).record(ev.RunStarted(
            attempt=attempt, node=os.environ.get("SLURMD_NODENAME", ""),
            command=" ".join(command)[:400]))
    except (JobwrapError, OSError) as exc:
        log.get().debug("run.not_recorded", error=str(exc))


def _latest(options: JobOptions) -> tuple[str, int | None] | None:
    # Only called between attempts, when nothing is writing: no settle time.
    found = resume_mod.latest(options.checkpoint_dir, options)
    return (found.path, found.step) if found else None
