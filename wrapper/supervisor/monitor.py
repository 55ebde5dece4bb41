"""The per-job supervisor: follows one attempt of a job until it ends.

It runs with the job user's rights (it reads the user's checkpoints and output, and it
may end the user's job, nothing more) and records what it sees as events in the job's
user-writable event file (for ``jobwrap status``; there they are only claims): new
checkpoints and their steps (progress), a hang (no new checkpoint and no output for the
hang timeout, fixed by ``--hang-timeout`` or learned from the job's
own cadence: hang_k x the longest gap between two signs of progress, and never less
than hang_floor, or hang_min once LEARN_AFTER such gaps were seen;
it ends the job so that it can be requeued, or, when the job's command runs under
``jobwrap run``, only its steps, which ``jobwrap run`` restarts in place), GPU faults on
the job's GPUs (it ends the job; the root epilog drains the node after its own check),
and the walltime (it sends the job's steps a checkpoint signal before the limit when
the job did not ask for one). Each tick costs a few ``stat`` calls and one directory listing;
Slurm is asked far less often.

What the epilog acts on (a hang it ended the job for, a GPU fault) it also writes to
``facts``: the root-owned channel root opened for it before the drop
(``wrapper.job.facts.FactChannel``), which the job's user cannot write.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import field
from typing import Any

from wrapper import log
from wrapper.config import SupervisorConfig
from wrapper.fastdataclass import dataclass
from wrapper.job import events as ev
from wrapper.job.record import JobRecord
from wrapper.job.state import JobState
from wrapper.submit.directives import JobOptions

RUNNING = {"RUNNING", "CONFIGURING", "SUSPENDED", "STOPPED"}
# Gaps between two signs of progress (output growth, new checkpoints) after which the
# longest is trusted as the job's cadence, and the hang timeout's floor drops from
# hang_floor to hang_min. At the supervisor's 2 s look, at least 40 s of a job's life.
LEARN_AFTER = 20


@dataclass
class Seen:
    checkpoint: str | None = None
    step: int | None = None
    output_size: int = -1
    last_progress: float = 0.0
    signalled: bool = False
    progress_count: int = 0  # signs of progress seen (output growth, new checkpoints)
    longest_gap: float = 0.0  # the longest time between two of them: the job's cadence
    gaps_seen: int = 0  # how many such gaps, over every command an in-place restart ran
    saves_seen: int = 0  # checkpoints that appeared while it watched (not one found at start)
    looked: bool = False  # the first look at the checkpoints is done
    run_restarts: int = 0  # jobwrap run's restarts of the command seen so far
    ended_by_us: str = ""
    faults: set[str] = field(default_factory=set)
    checkpoint_at: float = 0.0  # when the newest checkpoint was first seen complete
    save_asked: float = 0.0  # when the save file was touched (0: not yet)
    requeued: bool = False


class Supervisor:
    """One attempt's supervisor. ``tick`` is a plain method: tests drive it with a fake clock."""

    def __init__(self, record: JobRecord, state: JobState, cfg: SupervisorConfig, *,
                 options: JobOptions, attempt: int, job_state: Callable[[], str],
                 end_job: Callable[[str], bool], signal_job: Callable[[str], bool],
                 gpu_faults: Callable[[], list[str]] | None = None,
                 facts: Callable[[dict[str, Any]], None] | None = None,
                 await_forensics: Callable[[], None] | None = None,
                 requeue_job: Callable[[], bool] | None = None,
                 time_limit: Callable[[], float | None] | None = None,
                 under_run: Callable[[], bool] | None = None,
                 kill_steps: Callable[[], list[str]] | None = None,
                 run_restarts: Callable[[], int] | None = None,
                 pulse_hang: Callable[[], dict[str, Any] | None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.record = record
        self.state = state
        self.cfg = cfg
        self.attempt = attempt
        self.job_state = job_state
        self.end_job = end_job
        self.signal_job = signal_job
        self.gpu_faults = gpu_faults
        self.facts = facts
        self.await_forensics = await_forensics  # the node watchers' stacks, before the end
        self.requeue_job = requeue_job  # None: this job is not requeued on a save
        # the job's time limit now (Slurm's last answer: scontrol update moves it while
        # the job runs); None: the record's, read at the job's start
        self.time_limit = time_limit
        # whether the job's command runs under ``jobwrap run`` this attempt, and how to end
        # its steps only (the steps ended): a hang is then restarted in place
        self.under_run = under_run
        self.kill_steps = kill_steps
        self.run_restarts = run_restarts  # jobwrap run's restarts of the command so far
        # the pulse judge's newest hang verdict (root's pulse-hang.json), if any
        self.pulse_hang = pulse_hang
        self._pulse_seen: str = ""
        self.clock = clock
        # ``options``: the job's, merged with the site's defaults (job.record.site_options):
        # --hang-timeout=off is 0; None: learned from the job's cadence
        self.fixed_hang_timeout = options.hang_timeout
        self.seen = Seen(last_progress=clock())
        self._next_slurm = 0.0
        self._next_gpu = 0.0
        self.finished = False
        self.logger = log.get()

    def event(self, event: ev.Event) -> None:
        """Record ``event`` of this attempt in the job's (the user's) file and, for what
        root acts on (``FACT_KINDS``), first in root's fact channel."""
        from dataclasses import replace

        from wrapper.job.facts import FACT_EVENTS, fact
        from wrapper.job.store import JobStore

        event = replace(event, attempt=self.attempt)
        if self.facts is not None and event.KIND in FACT_EVENTS:  # first: root acts on it
            data = {k: v for k, v in event.encode().items() if k not in ("attempt", "node")}
            try:
                self.facts(fact(event.KIND, self.attempt, **data))
            except OSError as exc:
                self.logger.error("supervisor.fact_unwritable", event=event.KIND,
                                  error=str(exc))
        JobStore(self.state).record(event)

    def tick(self) -> None:
        now = self.clock()
        self._look_at_checkpoints(now)
        self._look_at_output(now)
        limit = self.hang_timeout
        if limit and not self.seen.ended_by_us and now - self.seen.last_progress >= limit:
            self._hang(ev.Hang(idle_s=round(now - self.seen.last_progress, 1),
                               hang_timeout_s=round(limit, 1),
                               learned=self.fixed_hang_timeout is None,
                               cadence_s=round(self.seen.longest_gap, 1),
                               last_checkpoint=self.seen.checkpoint))
        self._look_at_pulse(now)
        if self.gpu_faults is not None and now >= self._next_gpu:
            self._next_gpu = now + self.cfg.gpu_interval
            for fault in self.gpu_faults():
                if fault not in self.seen.faults:
                    self.seen.faults.add(fault)
                    self.event(ev.GpuFault(reason=fault))
                    self._end(ev.GpuFault.KIND)
        self._walltime(now)
        if now >= self._next_slurm:
            self._next_slurm = now + self.cfg.slurm_interval
            self._look_for_restarts()
            current = self.job_state()
            if current in RUNNING and self._superseded():
                current = "REQUEUED"  # a later attempt runs: its own supervisor follows it
            if current not in RUNNING:
                self.event(ev.SupervisorEnd(job_state=current or "gone",
                                            last_checkpoint=self.seen.checkpoint,
                                            step=self.seen.step))
                self.finished = True

    def _hang(self, hang: ev.Hang) -> None:
        """Record the hang (root's fact first), wait for every node's forensics, then end
        the job's steps for ``jobwrap run`` to restart in place, or else the job."""
        self.event(hang)
        if self.await_forensics is not None:
            self.await_forensics()
        if not self._restart_in_place():
            self._end(ev.Hang.KIND)

    def _look_at_pulse(self, now: float) -> None:
        """The pulse judge's verdict of this attempt (root's, from every rank's samples:
        wrapper/pulse/judge.py) is a hang as the supervisor's own, once per verdict. A job
        whose --hang-timeout is fixed, or off, said what a hang is: the verdict is only
        recorded then (root's pulse.hang)."""
        if self.pulse_hang is None or self.seen.ended_by_us or \
                self.fixed_hang_timeout is not None:
            return
        try:
            verdict = self.pulse_hang()
        except Exception as exc:  # a record it cannot read is no verdict
            self.logger.warning("supervisor.pulse_unreadable", error=str(exc)[:200])
            return
        if not verdict or verdict.get("attempt") != self.attempt:
            return
        key = f"{verdict.get('time')}:{verdict.get('held_s')}"
        if key == self._pulse_seen:
            return
        self._pulse_seen = key
        stuck = [str(s)[:300] for s in verdict.get("stuck") or []][:16]
        self._hang(ev.Hang(idle_s=round(now - self.seen.last_progress, 1),
                           hang_timeout_s=float(verdict.get("window_s") or 0.0),
                           learned=True, cadence_s=round(self.seen.longest_gap, 1),
                           last_checkpoint=self.seen.checkpoint, found_by="pulse",
                           stuck=stuck))

    @property
    def hang_timeout(self) -> float:
        """Seconds without progress that make a hang now (0: hang detection is off)."""
        if self.fixed_hang_timeout is not None:
            return self.fixed_hang_timeout
        floor = self.cfg.hang_min if self.cadence_learned else self.cfg.hang_floor
        return max(floor, self.cfg.hang_k * self.seen.longest_gap)

    @property
    def cadence_learned(self) -> bool:
        """Enough gaps between signs of progress were seen to trust the longest as the
        job's cadence: LEARN_AFTER of them, a checkpoint saved while it watched among
        them (a save's silence is part of the cadence), and progress from the command
        running now (a command restarted in place is starting up: hang_floor again until
        its first sign of progress)."""
        return self.seen.gaps_seen >= LEARN_AFTER and self.seen.saves_seen > 0 and \
            self.seen.progress_count > 0

    def _progress(self, now: float) -> None:
        # the gap before the first one is the job's start-up; a checkpoint and output in
        # one look are one sign, not a gap
        if self.seen.progress_count and now > self.seen.last_progress:
            self.seen.longest_gap = max(self.seen.longest_gap, now - self.seen.last_progress)
            self.seen.gaps_seen += 1
        self.seen.progress_count += 1
        self.seen.last_progress = now

    def run(self, sleep: Callable[[float], None] = time.sleep) -> None:
        self.remove_save_file()
        self.event(ev.SupervisorStart(pid=os.getpid(), hang_timeout_s=self.hang_timeout,
                                      checkpoint_dir=self.record.checkpoint_dir))
        while not self.finished:
            self.tick()
            if not self.finished:
                sleep(self.cfg.interval)

    def _superseded(self) -> bool:
        """A later attempt of the job has started (Slurm requeued it between two looks)."""
        from wrapper.job.store import JobStore

        return JobStore(self.state).superseded(self.attempt)

    # -- what it looks at ----------------------------------------------------------------
    def _look_at_checkpoints(self, now: float) -> None:
        directory = self.record.checkpoint_dir
        if not directory:
            return
        from wrapper.job.store import JobStore
        from wrapper.restart.resume import Suspect, latest

        # as the next attempt would resume: past a checkpoint root marked suspect
        suspects = [Suspect.of(e) for e in JobStore(self.state).suspects()]
        found = latest(directory, self.record.job_options, suspects=suspects,
                       settle_seconds=self.cfg.settle_seconds, now=now)
        if found is not None and found.path != self.seen.checkpoint:
            self.seen.checkpoint, self.seen.step = found.path, found.step
            self.seen.checkpoint_at = now
            if self.seen.looked:  # saved while it watched: progress of this command
                self.seen.saves_seen += 1
                self._progress(now)
            # one found at the first look is older than this attempt (the one it resumes
            # from): no progress, else the start-up after it would count as a cadence gap
            self.event(ev.Checkpoint(path=found.path, step=found.step, layout=found.layout))
        self.seen.looked = True

    def _look_at_output(self, now: float) -> None:
        size = 0
        for path in {self.record.stdout, self.record.stderr} - {""}:
            try:
                size += os.stat(path).st_size
            except OSError:
                continue
        if size != self.seen.output_size:
            if self.seen.output_size >= 0:
                self._progress(now)
            self.seen.output_size = size

    def _walltime(self, now: float) -> None:
        limit = self.time_limit() if self.time_limit is not None else self.record.time_limit_s
        start = self.record.start_time
        if self.record.asked_signal or not start:
            return
        if self.seen.signalled and not self.seen.requeued and \
                (not limit or now < start + limit - self.cfg.walltime_lead):
            self._limit_raised(limit)  # the request was for a limit the job no longer has
        if not limit:
            return
        if self.seen.signalled:
            self._requeue_when_saved(now, start + limit)
            return
        if now >= start + limit - self.cfg.walltime_lead and \
                self.signal_job(self.cfg.walltime_signal):
            self.seen.signalled = True
            touched = self._ask_for_a_save(now)
            self.event(ev.WalltimeSignal(signal=self.cfg.walltime_signal,
                                         seconds_left=round(start + limit - now),
                                         save_file=touched))

    def _limit_raised(self, limit: float | None) -> None:
        """The limit was raised (or lifted) after the save request: withdraw it, so that
        the job is not requeued early for nothing; the signal and the request come again
        ``walltime_lead`` before the new limit."""
        self.logger.info("supervisor.walltime_withdrawn", time_limit_s=limit)
        self.seen.signalled = False
        self.seen.save_asked = 0.0
        self.remove_save_file()

    def _ask_for_a_save(self, now: float) -> str:
        """Touch the save file (the job user's checkpoint folder, our rights); its path,
        or "" when the job has no checkpoint folder or the file cannot be made."""
        from wrapper.restart.resume import save_file

        path = save_file(self.record.checkpoint_dir)
        if path is None:
            return ""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
            os.close(fd)
        except OSError as exc:
            self.logger.warning("supervisor.save_file_unwritable", path=path, error=str(exc))
            return ""
        self.seen.save_asked = now
        return path

    def _requeue_when_saved(self, now: float, limit_at: float) -> None:
        """Once a checkpoint first seen complete after the save request exists, requeue the
        job now: the time until the limit would only make steps its next attempt redoes."""
        seen = self.seen
        if self.requeue_job is None or seen.requeued or not seen.save_asked \
                or seen.checkpoint_at <= seen.save_asked or now >= limit_at:
            return
        seen.requeued = True  # once, whatever the answer: Slurm's limit is the fallback
        if self.requeue_job():
            self.event(ev.WalltimeRequeued(checkpoint=seen.checkpoint,
                                           seconds_left=round(limit_at - now)))

    def remove_save_file(self) -> None:
        """An earlier attempt's save request is not this one's."""
        from wrapper.restart.resume import save_file

        path = save_file(self.record.checkpoint_dir)
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def _restart_in_place(self) -> bool:
        """Under ``jobwrap run`` this attempt, end the job's steps only, not the job:
        ``jobwrap run`` sees its command fail after this attempt's hang and restarts it
        inside the allocation from the latest valid checkpoint, under its brakes
        (--max-restarts, no progress). False, and the job is ended as without it, when it
        does not run under ``jobwrap run`` or has no step to end (a command that runs no
        srun step)."""
        if self.kill_steps is None or self.under_run is None or not self.under_run():
            return False
        steps = self.kill_steps()
        if not steps:
            return False
        self.logger.warning("supervisor.steps_killed", why=ev.Hang.KIND, steps=steps)
        self.event(ev.HangInPlace(steps=steps))
        self._command_restarted()
        return True

    def _command_restarted(self) -> None:
        """The command starts afresh (restarted in place, by us or by ``jobwrap run``): its
        start-up is not a gap of its cadence, and it runs under hang_floor until it shows
        progress."""
        self.seen.last_progress = self.clock()
        self.seen.progress_count = 0

    def _look_for_restarts(self) -> None:
        """``jobwrap run`` restarted the command since the last look (its
        ``run.restarted``, the user's word: a lie only delays its own hang verdict)."""
        if self.run_restarts is None:
            return
        count = self.run_restarts()
        if count > self.seen.run_restarts:
            self.seen.run_restarts = count
            self._command_restarted()

    def _end(self, why: str) -> None:
        if self.seen.ended_by_us:
            return
        self.logger.warning("supervisor.ending_job", why=why)
        if self.end_job(why):
            self.seen.ended_by_us = why
