"""``jobwrap run [options] -- CMD ...``: restart CMD inside the allocation, no queue wait.

Same options and the same restart policy as the directives, whose values it takes
where its own command line gives none: each new attempt gets
``JOBWRAP_ATTEMPT`` and, when a valid checkpoint exists, ``JOBWRAP_RESUME_FROM``.
Signals sent to jobwrap (Slurm's pre-timeout signal, scancel's SIGTERM) are forwarded
to the command's process group; after a SIGTERM or SIGINT there is no restart. Nor is
there when root found a node of the job faulty (a watcher's GPU fault, a drain with
jobwrap's reason, a node Slurm lost): the command's status ends the job, and the
epilog's requeue puts it on healthy nodes, unless the job holds spare nodes
(``--spare-nodes``): then the faulty node is given back and the work restarts at once on
the healthy ones with a spare in its place, inside the allocation
(:class:`wrapper.restart.spares.Spares`). A node srun could not reach is awaited until
Slurm judges it (:func:`faults_after`), so that a restart never races Slurm's verdict.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import field
from types import FrameType
from typing import IO, TYPE_CHECKING

from wrapper import log
from wrapper.config import Config
from wrapper.fastdataclass import dataclass
from wrapper.job import events as ev
from wrapper.restart import resume as resume_mod
from wrapper.restart.classify import (
    HANG,
    HARDWARE,
    NODE_FAILURE,
    Evidence,
    oom_kill_in_output,
)
from wrapper.restart.judge import Facts, judge
from wrapper.restart.policy import PastAttempt
from wrapper.restart.spares import (
    Spares,
    await_verdict,
    faulty_nodes,
    record_claim,
    working_before,
)
from wrapper.submit.directives import JobOptions, allowed_restarts

if TYPE_CHECKING:
    pass

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
    max_restarts = allowed_restarts(options, cfg)
    base_attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    spares = Spares.of(options, os.environ, working=working_before(cfg))
    _note(cfg, ev.RunStarted(attempt=base_attempt, command=" ".join(command)[:400],
                             spare_nodes=spares.left if spares is not None else 0))
    if spares is not None:
        say(f"jobwrap run: working on {spares.working} of the job's {len(spares.nodes)} "
            f"nodes; {spares.left} spare ({','.join(spares.nodes[spares.working:])})")
    attempt = 0
    swaps = 0  # restarts onto a spare: a node's fault, so none of --max-restarts
    before = ("", 0.0)  # what ended the command before this restart, and when (the ledger)
    while True:
        resume = _latest(options)
        resumes = bool(resume) and (attempt > 0 or base_attempt > 0
                                    or resume_mod.RESUME_FROM in os.environ)
        base_env = spares.environ(os.environ) if spares is not None else os.environ
        under = {resume_mod.UNDER_RUN: resume_mod.under_run_value(os.environ)}
        env = resume_mod.environ({**base_env, **under}, resume_mod.exports(
            attempt=base_attempt + attempt, scratch=None,
            checkpoint_dir=os.path.abspath(options.checkpoint_dir)
            if options.checkpoint_dir else None,
            resume_from=resume[0] if resume and resumes else None))
        if attempt > 0:
            say(f"jobwrap run: attempt {attempt}: " + (f"resuming from {resume[0]}" if resume
                and resumes else "starting from the beginning"))
            _note(cfg, ev.RunRestarted(attempt=base_attempt, restart=attempt,
                                       kind_ended=before[0], ended_at=before[1]))
        started, started_at = time.monotonic(), time.time()
        try:
            state.child = subprocess.Popen(list(command), env=env, start_new_session=True,
                                           stderr=subprocess.PIPE)
        except OSError as exc:
            say(f"jobwrap run: cannot start {command[0]!r}: {exc.strerror}")
            return 127
        tail = ErrorTail(state.child.stderr)
        status = state.child.wait()
        ended_at = time.time()
        tail.finish()
        code, sig = (status, 0) if status >= 0 else (0, -status)
        logger.info("run.attempt_end", attempt=attempt, exit_code=code, signal=sig,
                    seconds=round(time.monotonic() - started, 2))
        if state.stopping:
            return status if status >= 0 else 128 + sig
        text = tail.text()
        # jobwrap ended the command's steps (the supervisor after a hang, a watcher after a
        # GPU fault): a failure, even when the command went on past its srun and ended 0
        # (a whole batch script under jobwrap run, [restart] batch_wrapper)
        ended = ended_by_jobwrap(cfg, base_attempt, started_at)
        failed = status != 0 or bool(ended)
        faulty: dict[str, str] | None = None  # asked of Slurm once per failure (or awaited)
        if failed and spares is not None:
            faulty = faults_after(cfg, base_attempt, text, spares.nodes, say,
                                  since=started_at, stop=lambda: state.stopping)
            if state.stopping:  # scancel's SIGTERM came while Slurm was asked
                return status if status >= 0 else 128 + sig
            if faulty and spares.replace_faulty(cfg, faulty, say):
                attempt, swaps = attempt + 1, swaps + 1
                lost = all(why.startswith("Slurm lost") for why in faulty.values())
                before = (NODE_FAILURE if lost else HARDWARE, ended_at)
                continue
        # srun's own words tell a rank's segfault from its kill where srun's status is the
        # same (143 after --kill-on-bad-exit): without them two different faults would
        # read as "the same error" and stop the restarts
        # The output is jobwrap run's own evidence (it decides for the job's user alone):
        # slurmstepd's OOM-kill line there is the OOM kill root would see in Slurm.
        after = _latest(options)
        judgement = judge(Facts(
            evidence=Evidence(exit_code=code, exit_signal=sig, output_tail=text,
                              oom_kill=oom_kill_in_output(text)),
            attempt=attempt - swaps, max_restarts=max_restarts,
            no_requeue=options.no_requeue, history=state.history,
            checkpoint_step=after[1] if after else None,
            checkpoint_path=after[0] if after else None,
            no_progress_limit=cfg.restart.no_progress_limit, ended_by=ended))
        verdict, decision = judgement.verdict, judgement.decision
        if decision.action == "done":
            return 0
        say(f"jobwrap run: attempt {attempt} ended: {verdict.kind} ({verdict.detail}); "
            + ("restarting in place" if decision.requeue else f"stopping: {decision.reason}"))
        if not decision.requeue:
            _note(cfg, ev.RunStopped(attempt=base_attempt, kind_ended=verdict.kind,
                                     reason=decision.reason[:400]))
            return code if code else 128 + sig
        if faulty is None:
            faulty = faults_after(cfg, base_attempt, text, _job_nodes(), say,
                                  since=started_at, stop=lambda: state.stopping)
        if state.stopping:
            return code if code else 128 + sig
        if faulty:  # never restart in place on a node root found faulty: the queue's turn
            where = "; ".join(f"{node}: {why}" for node, why in sorted(faulty.items()))
            say(f"jobwrap run: not restarting in place: a node of the job is faulty ({where}); "
                "ending, so that jobwrap requeues the job away from it")
            return code if code else 128 + sig
        state.history.append(PastAttempt(attempt, verdict.kind, verdict.signature,
                                         after[1] if after else None,
                                         after[0] if after else None))
        attempt, before = attempt + 1, (verdict.kind, ended_at)


class ErrorTail:
    """The command's standard error passed through to ours as it comes, its last
    :attr:`KEEP` bytes kept for the verdict (srun's ``task 1: Segmentation fault``, a
    rank's traceback). This is the user's own process deciding the user's own restarts:
    the text is evidence here, as root's epilog may not take it."""

    KEEP = 64 * 1024

    def __init__(self, stream: IO[bytes] | None) -> None:
        self.kept = bytearray()
        self.thread: threading.Thread | None = None
        if stream is not None:
            self.thread = threading.Thread(target=self._pump, args=(stream,), daemon=True,
                                           name="stderr-tail")
            self.thread.start()

    def _pump(self, stream: IO[bytes]) -> None:
        out = getattr(sys.stderr, "buffer", None)
        fd = stream.fileno()
        while chunk := os.read(fd, 65536):
            if out is not None:
                with contextlib.suppress(OSError, ValueError):
                    out.write(chunk)
                    out.flush()
            self.kept += chunk
            if len(self.kept) > 2 * self.KEEP:
                del self.kept[:-self.KEEP]
        stream.close()

    def finish(self) -> None:
        """Wait briefly for the rest: a child the command left running may hold the pipe."""
        if self.thread is not None:
            self.thread.join(timeout=2.0)

    def text(self) -> str:
        return bytes(self.kept[-self.KEEP:]).decode("utf-8", "replace")


def faults_after(cfg: Config, attempt: int, text: str, nodes: Sequence[str] | None,
                 say: Callable[[str], None], *, since: float | None = None,
                 stop: Callable[[], bool] = lambda: False) -> dict[str, str]:
    """The job's nodes root or Slurm found faulty after a failed run; when srun's errors
    (``text``) say it could not reach a node of which Slurm has no verdict yet, asked
    again until it has one, for at most ``[restart] node_verdict_wait``."""
    from wrapper.slurm.parse import nodes_srun_lost

    suspects = nodes_srun_lost(text, among=nodes) if nodes else []
    found = faulty_nodes(cfg, attempt, nodes=nodes, suspects=suspects, since=since)
    wait_s = cfg.restart.node_verdict_wait
    if found or not suspects or wait_s <= 0:
        return found
    say(f"jobwrap run: srun could not reach {','.join(suspects)}; waiting up to "
        f"{wait_s:g} s for Slurm to say whether it is lost")
    return await_verdict(lambda: faulty_nodes(cfg, attempt, nodes=nodes, suspects=suspects,
                                              since=since), suspects,
                         wait_s=wait_s, stop=stop)


def _job_nodes() -> list[str]:
    """The job's nodes (``SLURM_JOB_NODELIST``); none outside a job or when it does not
    read."""
    from wrapper.errors import SlurmError
    from wrapper.slurm.parse import expand_hostlist

    try:
        return expand_hostlist(os.environ.get("SLURM_JOB_NODELIST", ""))
    except SlurmError:
        return []


def with_directives(options: JobOptions, cfg: Config) -> JobOptions:
    """``options`` over the job's own ``#JOBWRAP`` directives and the site's defaults
    (``job.record.merged_options``). Outside a job, or without its record, ``options``
    over the site's defaults alone."""
    from wrapper.errors import JobwrapError
    from wrapper.job import record as jobrecord
    from wrapper.job.state import for_job

    job_id = os.environ.get("SLURM_JOB_ID", "")
    record = None
    if job_id.isdigit():
        try:
            record = jobrecord.load(for_job(cfg, job_id))
        except (JobwrapError, OSError):
            record = None
    return jobrecord.merged_options(options, record, cfg)


def ended_by_jobwrap(cfg: Config, attempt: int, since: float) -> str:
    """Why jobwrap ended the job's steps in Slurm attempt ``attempt`` after ``since`` (a
    timestamp): ``hang`` (the supervisor's, written before it ends the steps, so it is
    there when the command fails; the job's own event file, the user's process deciding
    the user's own restarts, as the command's output is), a node watcher's fault reason
    (root's ``watch.ended_job``), or ""."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        return ""
    from wrapper.errors import JobwrapError
    from wrapper.job import events as ev
    from wrapper.job.store import JobStore

    try:
        events = JobStore.of(cfg, job_id).events()
    except (JobwrapError, OSError):
        return ""
    late = [e for e in events if e.attempt == attempt and e.ts >= since]
    if any(isinstance(e, ev.Hang) for e in late):
        return HANG
    return next((e.reason or "a fault" for e in late
                 if isinstance(e, ev.WatchEndedJob) and e.from_root), "")


def _note(cfg: Config, event: ev.Event) -> None:
    """Note ``event`` (run.started, run.restarted, run.stopped) in the job's (the user's)
    event file: the supervisor times a restarted command afresh, the epilog does not
    requeue what jobwrap run's brakes stopped. Outside a Slurm job, or without the job's
    state folder, nothing."""
    from dataclasses import replace

    job_id = os.environ.get("SLURM_JOB_ID", "")
    if job_id.isdigit():
        record_claim(cfg, job_id, replace(event, node=os.environ.get("SLURMD_NODENAME", "")))


def _latest(options: JobOptions) -> tuple[str, int | None] | None:
    # Only called between attempts, when nothing is writing: no settle time.
    found = resume_mod.latest(options.checkpoint_dir, options)
    return (found.path, found.step) if found else None
