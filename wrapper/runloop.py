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
the healthy ones with a spare in its place, inside the allocation (:class:`Spares`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from types import FrameType
from typing import IO, TYPE_CHECKING

from wrapper import log
from wrapper.config import Config
from wrapper.directives import JobOptions
from wrapper.lean import dataclass
from wrapper.restart import resume as resume_mod
from wrapper.restart.classify import HANG, Classification, Evidence, classify
from wrapper.restart.policy import PastAttempt, decide

if TYPE_CHECKING:
    from wrapper.job.events import Event
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
    spares = Spares.of(options, os.environ, working=_working_before(cfg))
    _record_start(cfg, command, base_attempt, spares.left if spares is not None else 0)
    if spares is not None:
        say(f"jobwrap run: working on {spares.working} of the job's {len(spares.nodes)} "
            f"nodes; {spares.left} spare ({','.join(spares.nodes[spares.working:])})")
    attempt = 0
    swaps = 0  # restarts onto a spare: a node's fault, so none of --max-restarts
    while True:
        resume = _latest(options)
        resumes = bool(resume) and (attempt > 0 or base_attempt > 0
                                    or resume_mod.RESUME_FROM in os.environ)
        base_env = spares.environ(os.environ) if spares is not None else os.environ
        env = resume_mod.environ({**base_env, resume_mod.UNDER_RUN: "1"}, resume_mod.exports(
            attempt=base_attempt + attempt, scratch=None,
            checkpoint_dir=os.path.abspath(options.checkpoint_dir)
            if options.checkpoint_dir else None,
            resume_from=resume[0] if resume and resumes else None))
        if attempt > 0:
            say(f"jobwrap run: attempt {attempt}: " + (f"resuming from {resume[0]}" if resume
                and resumes else "starting from the beginning"))
        started, started_at = time.monotonic(), time.time()
        try:
            state.child = subprocess.Popen(list(command), env=env, start_new_session=True,
                                           stderr=subprocess.PIPE)
        except OSError as exc:
            say(f"jobwrap run: cannot start {command[0]!r}: {exc.strerror}")
            return 127
        tail = ErrorTail(state.child.stderr)
        status = state.child.wait()
        tail.finish()
        code, sig = (status, 0) if status >= 0 else (0, -status)
        logger.info("run.attempt_end", attempt=attempt, exit_code=code, signal=sig,
                    seconds=round(time.monotonic() - started, 2))
        if state.stopping:
            return status if status >= 0 else 128 + sig
        faulty: dict[str, str] | None = None  # asked of Slurm at most once per failure
        if status != 0 and spares is not None:
            faulty = faulty_nodes(cfg, base_attempt, nodes=spares.nodes)
            if faulty and spares.replace_faulty(cfg, faulty, say):
                attempt, swaps = attempt + 1, swaps + 1
                continue
        # srun's own words tell a rank's segfault from its kill where srun's status is the
        # same (143 after --kill-on-bad-exit): without them two different faults would
        # read as "the same error" and stop the restarts
        verdict = classify(Evidence(exit_code=code, exit_signal=sig, output_tail=tail.text()))
        if status != 0 and hung_since(cfg, base_attempt, started_at):
            verdict = Classification(HANG, "no progress for the hang timeout; jobwrap's "
                                     "supervisor ended the command's steps", "hang")
        after = _latest(options)
        decision = decide(verdict, attempt=attempt - swaps, max_restarts=max_restarts,
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
        if faulty is None:
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


def with_directives(options: JobOptions, cfg: Config) -> JobOptions:
    """``options`` over the job's own ``#JOBWRAP`` directives (root's record of the job):
    a script that wraps its command in ``jobwrap run --`` need not repeat them. Outside a
    job, or without its record, ``options`` alone."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        return options
    from wrapper.errors import JobwrapError
    from wrapper.job import record as jobrecord
    from wrapper.job.state import for_job

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


@dataclass
class Spares:
    """The job's nodes under ``--spare-nodes``: the first ``working`` of ``nodes`` (the
    allocation now) carry the work, the rest wait, watched by their node watchers.

    srun places a step on the allocation's first nodes in its order, so the command's
    environment saying ``working`` nodes (``SLURM_JOB_NUM_NODES``, srun's ``-N``) keeps
    its steps off the spares, in nested scripts too. When a node fails, it is given back
    (``scontrol update JobId= NodeList=``; one Slurm lost is gone already under
    ``--no-kill``) and the next spare in order becomes a working node."""

    working: int
    nodes: list[str]
    used: int = 0

    @property
    def left(self) -> int:
        return len(self.nodes) - self.working

    @classmethod
    def of(cls, options: JobOptions, environ: Mapping[str, str], *,
           working: int | None = None) -> Spares | None:
        """``working``: the count an earlier attempt worked on, when it used spares (a
        job that gave nodes back is requeued with fewer: its spares are spent)."""
        from wrapper.slurm.parse import expand_hostlist

        count = options.spare_nodes or 0
        try:
            nodes = expand_hostlist(environ.get("SLURM_JOB_NODELIST", ""))
        except ValueError:
            return None
        if working is None:
            working = len(nodes) - count
        if count <= 0 or not environ.get("SLURM_JOB_ID", "").isdigit() \
                or not 0 < working < len(nodes):
            return None
        return cls(working=working, nodes=nodes)

    def environ(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The command's environment: srun's default node count is the working nodes',
        and the task count follows where the job gave tasks per node."""
        env = dict(environ)
        env["SLURM_JOB_NUM_NODES"] = env["SLURM_NNODES"] = str(self.working)
        env["SLURM_JOB_NODELIST"] = env["SLURM_NODELIST"] = ",".join(self.nodes)
        per_node = env.get("SLURM_NTASKS_PER_NODE", "")
        if per_node.isdigit() and env.get("SLURM_NTASKS", "").isdigit():
            env["SLURM_NTASKS"] = env["SLURM_NPROCS"] = str(int(per_node) * self.working)
        return env

    def replace_faulty(self, cfg: Config, faulty: Mapping[str, str],
                       say: Callable[[str], None], backend: SlurmBackend | None = None) -> bool:
        """After a failed run, ``faulty`` (:func:`faulty_nodes` of the working nodes)
        given: when spares are left, give those nodes back and move the work onto spares
        (True); else False, and the usual path decides (a restart in place, or the
        epilog's requeue)."""
        if not faulty:
            return False
        if backend is None:
            from wrapper import slurm

            backend = slurm.backend(cfg.slurm)
        keep = [n for n in self.nodes if n not in faulty]
        where = "; ".join(f"{node}: {why}" for node, why in sorted(faulty.items()))
        if len(keep) < self.working:
            say(f"jobwrap run: no spare node left for {where}")
            return False
        job_id = os.environ["SLURM_JOB_ID"]
        from wrapper.errors import JobwrapError
        from wrapper.slurm.parse import expand_hostlist

        try:  # a node Slurm lost under --no-kill has left the allocation already
            held = expand_hostlist(backend.job_info(job_id).get("NodeList", ""))
            if any(n in held for n in faulty):
                backend.shrink_job(job_id, [n for n in held if n not in faulty])
        except (JobwrapError, ValueError) as exc:
            say(f"jobwrap run: could not give back {', '.join(sorted(faulty))} ({exc}); "
                "ending, so that jobwrap requeues the job away from it")
            return False
        before = set(self.nodes[:self.working])
        self.nodes = keep
        self.used += len(faulty)
        took = [n for n in keep[:self.working] if n not in before]
        say(f"jobwrap run: {where}; gave it back and restarted on "
            f"{','.join(keep[:self.working])} (spare {','.join(took)} took its place; "
            f"{self.left} spare left)")
        from wrapper.job import events as ev

        _record(cfg, job_id, ev.SpareUsed(
            attempt=int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
            node=os.environ.get("SLURMD_NODENAME", ""),
            failed=sorted(faulty), reason=where[:400], replaced_by=took,
            spares_left=self.left, working=self.working))
        return True


def faulty_nodes(cfg: Config, attempt: int, backend: SlurmBackend | None = None, *,
                 nodes: Sequence[str] | None = None) -> dict[str, str]:
    """``{node: why}`` for the job's nodes (``nodes``: these of them) root found faulty
    during this attempt: a node watcher's fault in root's record here, a node drained
    with a jobwrap reason, a node Slurm lost. Root's and Slurm's facts only; outside a
    job, or when Slurm cannot be asked, nothing (the next attempt's own watchers still
    follow it)."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        return {}
    from wrapper.errors import JobwrapError
    from wrapper.job.state import for_job
    from wrapper.restart.remote import faults_elsewhere, node_records
    from wrapper.slurm.parse import expand_hostlist
    from wrapper.slurm.records import node_lost

    try:
        if nodes is None:
            nodes = expand_hostlist(os.environ.get("SLURM_JOB_NODELIST", ""))
        if backend is None:
            from wrapper import slurm

            backend = slurm.backend(cfg.slurm)
        events = for_job(cfg, job_id).events(root_only=True)
        records = dict(node_records(backend, nodes, ""))  # one request for every node
        found = faults_elsewhere(backend, list(nodes), "", attempt, events, records)
        for node, info in records.items():
            if node not in found and node_lost(info):
                found[node] = f"Slurm lost it ({info.get('State', '')})"
    except (JobwrapError, OSError) as exc:
        log.get().warning("run.faults_unknown", error=str(exc))
        return {}
    return found


def hung_since(cfg: Config, attempt: int, since: float) -> bool:
    """Whether the supervisor called this job hung in Slurm attempt ``attempt`` after
    ``since`` (a timestamp): it then ended the command's steps (``hang.in_place``), or the
    whole job. Its ``hang`` is written before the steps are ended, so it is there when
    the command fails. The job's own event file: the user's process deciding the user's
    own restarts, as the command's output is."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        return False
    from wrapper.errors import JobwrapError
    from wrapper.job import events as ev
    from wrapper.job.store import JobStore

    try:
        events = JobStore.of(cfg, job_id).events()
    except (JobwrapError, OSError):
        return False
    return any(isinstance(e, ev.Hang) and e.attempt == attempt and e.ts >= since
               for e in events)


def _record_start(cfg: Config, command: Sequence[str], attempt: int, spares: int) -> None:
    """Note in the job's (the user's) event file that the command runs under ``jobwrap
    run``; outside a Slurm job, or without the job's state folder, nothing."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        return
    from wrapper.job import events as ev

    _record(cfg, job_id, ev.RunStarted(attempt=attempt,
                                       node=os.environ.get("SLURMD_NODENAME", ""),
                                       command=" ".join(command)[:400],
                                       spare_nodes=spares))


def _working_before(cfg: Config) -> int | None:
    """The working node count an earlier attempt of this job recorded when it used a
    spare (the user's own file: a lie only misplaces the user's own steps)."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        return None
    from wrapper.errors import JobwrapError
    from wrapper.job import events as ev
    from wrapper.job.store import JobStore

    try:
        used = [e for e in JobStore.of(cfg, job_id).events() if isinstance(e, ev.SpareUsed)]
    except (JobwrapError, OSError):
        return None
    return used[-1].working if used and used[-1].working > 0 else None


def _record(cfg: Config, job_id: str, event: Event) -> None:
    """Append to the job's (the user's) event file; without its state folder, nothing."""
    from wrapper.errors import JobwrapError
    from wrapper.job.store import JobStore

    try:
        JobStore.of(cfg, job_id).record(event)
    except (JobwrapError, OSError) as exc:
        log.get().debug("run.not_recorded", error=str(exc))


def _latest(options: JobOptions) -> tuple[str, int | None] | None:
    # Only called between attempts, when nothing is writing: no settle time.
    found = resume_mod.latest(options.checkpoint_dir, options)
    return (found.path, found.step) if found else None
