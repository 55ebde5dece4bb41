"""Start and run the supervisor of one job attempt.

The prolog starts it on the job's first node: as the ``jobwrap-supervisor@JOBID``
systemd unit where systemd runs and the unit is installed, otherwise as a detached
process (double fork, new session, no inherited descriptors) that neither slurmd's wait
on the prolog nor the job's process tracking holds on to. Either way ``supervise``
drops to the job user's rights before it looks at anything.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from wrapper import log
from wrapper.config import Config
from wrapper.errors import JobwrapError
from wrapper.job import events as ev
from wrapper.job import state as state_mod
from wrapper.job.paths import SUPERVISOR_LOG
from wrapper.job.record import JobRecord
from wrapper.job.state import JobState
from wrapper.job.store import JobStore
from wrapper.runner import Runner

if TYPE_CHECKING:
    from wrapper.slurm import SlurmBackend

BATCH_SHELL_SETTLE = 5.0  # seconds a batch shell runs before it is sent the walltime signal

UNIT_DIRS = ("/etc/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")
SUPERVISOR_LOG_MAX = 16 << 20  # bytes; past it one log.capped line, then nothing


def systemd_unit_available() -> bool:
    return Path("/run/systemd/system").is_dir() and any(
        Path(d, "jobwrap-supervisor@.service").exists() for d in UNIT_DIRS)


def start(job_id: str, cfg: Config) -> str:
    """Start the supervisor of ``job_id``; returns how ("systemd" or "detached:PID")."""
    if systemd_unit_available():
        Runner().run(["systemctl", "start", "--no-block",
                      f"jobwrap-supervisor@{job_id}.service"], timeout=10)
        return "systemd"
    from wrapper import detach

    argv = detach.jobwrap_argv("supervise", job_id)
    return f"detached:{detach.spawn(argv, detach.hook_env(cfg.source))}"


def supervise(job_id: str, cfg: Config) -> int:
    """The ``jobwrap supervise JOBID`` verb: drop rights, then follow the attempt."""
    from wrapper import slurm
    from wrapper.job import record as jobrecord
    from wrapper.job.facts import FactChannel
    from wrapper.osl.users import UserIds, drop_to, not_dumpable
    from wrapper.supervisor.monitor import Supervisor

    os.chdir("/")  # hold no directory of the hook that started us
    state = state_mod.for_job(cfg, job_id)
    record = jobrecord.load(state)
    # The channel root reads the supervisor's reports from: opened now, as root.
    try:
        channel = FactChannel.open(state)
    except JobwrapError as exc:  # its hangs will not count for the epilog; keep watching
        log.get().error("supervisor.no_fact_channel", error=str(exc))
        channel = None
    attempt = _current_attempt(state)  # root's events, read before the rights go
    log_fd = _open_log(state, record.uid)
    if os.geteuid() == 0:
        if record.uid <= 0:
            raise JobwrapError(f"job {job_id}: no job user recorded; refusing to supervise "
                               "as root")
        drop_to(UserIds.of(record.uid, record.gid))
        not_dumpable()
    log.configure(file_fd=log_fd, level=cfg.log.level, stderr_format="json",
                  max_bytes=SUPERVISOR_LOG_MAX)
    log.bind(hook="supervisor", job_id=job_id, node=record.first_node, attempt=attempt)
    backend = slurm.backend(cfg.slurm)

    def end_job(why: str) -> bool:
        try:
            backend.signal_job(job_id, "KILL", full=True)
        except JobwrapError as exc:
            log.get().error("supervisor.end_failed", why=why, error=str(exc))
            return False
        return True

    def signal_job(sig: str) -> bool:
        # Like Slurm's own --signal (without B:), to the job's steps; a job without steps
        # (no srun) gets it in its batch shell (scancel --full), else it would get none.
        try:
            steps = backend.job_steps(job_id)
            if not steps and time.time() - (record.start_time or 0) < BATCH_SHELL_SETTLE:
                return False  # its batch shell may not have set its trap yet: next look
            backend.signal_job(job_id, sig, full=not steps)
        except JobwrapError as exc:
            log.get().warning("supervisor.signal_failed", error=str(exc))
            return False
        return True

    def requeue_job() -> bool:
        # What Lightning's auto-requeue does: the job's owner requeues its own job.
        try:
            backend.requeue(job_id)
        except JobwrapError as exc:
            log.get().warning("supervisor.requeue_failed", error=str(exc))
            return False
        return True

    def kill_steps() -> list[str]:
        # The job's steps by id (its batch script, and jobwrap run in it, go on).
        try:
            return backend.kill_steps(job_id)
        except JobwrapError as exc:
            log.get().warning("supervisor.kill_steps_failed", error=str(exc))
            return []

    def under_run() -> bool:
        return JobStore(state).under_run(attempt)

    def run_restarts() -> int:
        return JobStore(state).run_restarts(attempt)

    from wrapper.job.paths import PULSE_HANG_FILE
    from wrapper.submit.directives import allowed_restarts

    options = record.job_options
    may_requeue = cfg.supervisor.walltime_requeue and not options.no_requeue and \
        attempt < allowed_restarts(options, cfg)
    job_state = SlurmLook(backend, job_id, state, attempt,
                          unreachable_after=cfg.supervisor.slurm_unreachable,
                          ask_every=cfg.supervisor.slurm_ask_every,
                          time_limit_s=record.time_limit_s, follows_limit=True)
    supervisor = Supervisor(record, state, cfg.supervisor, options=record.options_for(cfg),
                            attempt=attempt,
                            job_state=job_state, end_job=end_job, signal_job=signal_job,
                            time_limit=lambda: job_state.time_limit_s,
                            under_run=under_run, kill_steps=kill_steps,
                            run_restarts=run_restarts,
                            gpu_faults=_gpu_fault_reader(cfg, record),
                            facts=channel.write if channel else None,
                            await_forensics=_forensics_waiter(cfg, state, attempt),
                            pulse_hang=lambda: state.read_json(PULSE_HANG_FILE),
                            requeue_job=requeue_job if may_requeue else None)
    supervisor.run()
    return 0


class SlurmLook:
    """The supervisor's ``job_state``: where the job stands, asking slurmctld little.

    The job's end is seen here first: its epilog on this node writes root's
    epilog.context. Slurm itself is asked at most once every ``ask_every`` seconds (a
    job gone without an epilog: node failure), not at every look: at steady state a
    supervisor costs slurmctld one call per minute. The same answer carries the job's
    time limit now (:attr:`time_limit_s`): one changed with ``scontrol update JobId=
    TimeLimit=`` while the job runs is followed within ``ask_every``, at no extra call.
    """

    def __init__(self, backend: SlurmBackend, job_id: str, state: JobState, attempt: int, *,
                 unreachable_after: float, ask_every: float = 60.0,
                 ask_at_once: bool = True, time_limit_s: float | None = None,
                 follows_limit: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``ask_every``: the fewest seconds between two asks; ``ask_at_once``: the first
        look asks (else the first ask waits ``ask_every``: the prolog just saw the job);
        ``time_limit_s``: the limit known before the first answer (the job's record);
        ``follows_limit``: a change of it is the caller's business and logged (the
        supervisor's; a watcher only keeps it)."""
        self.backend = backend
        self.job_id = job_id
        self.state = state
        self.attempt = attempt
        self.unreachable_after = unreachable_after
        self.ask_every = ask_every
        self.clock = clock
        self.asked: float | None = None if ask_at_once else clock()
        self.unreachable_since: float | None = None
        self.time_limit_s = time_limit_s  # seconds; None: unlimited
        self.follows_limit = follows_limit

    def __call__(self) -> str:
        if any(isinstance(e, ev.EpilogContext) and e.attempt == self.attempt
               for e in JobStore(self.state).root_events()):
            return "COMPLETING"
        now = self.clock()
        if self.asked is not None and now - self.asked < self.ask_every:
            return "RUNNING"
        self.asked = now
        try:
            state_now, limit = self.backend.job_state_and_limit(self.job_id)
        except JobwrapError as exc:
            log.get().warning("supervisor.slurm_unreachable", error=str(exc))
            if self.unreachable_since is None:
                self.unreachable_since = now
            if now - self.unreachable_since > self.unreachable_after:
                return "UNREACHABLE"  # not RUNNING: the supervisor ends, the epilog decides
            return "RUNNING"  # keep watching; Slurm may be back on the next look
        self.unreachable_since = None
        self._follow_limit(limit)
        return state_now

    def _follow_limit(self, text: str) -> None:
        """Take the limit Slurm gave; one it did not give, or that does not read (squeue's
        ``INVALID``, ``NOT_SET``), leaves the last one known."""
        from wrapper.slurm.records import time_limit_seconds

        text = text.strip()
        limit = None if text.upper() in ("UNLIMITED", "INFINITE") else time_limit_seconds(text)
        if limit is None and text.upper() not in ("UNLIMITED", "INFINITE"):
            return
        if limit != self.time_limit_s:
            if self.follows_limit:
                log.get().info("supervisor.time_limit", was_s=self.time_limit_s, now_s=limit)
            self.time_limit_s = limit


def _open_log(state: JobState, uid: int) -> int | None:
    """The supervisor's log, opened before the rights go: root's file (readable by the job's
    user through an ACL), written only through this descriptor of a non-dumpable process,
    so the user can neither write it directly nor grow it past SUPERVISOR_LOG_MAX."""
    from wrapper.osl import files

    path = state.path / SUPERVISOR_LOG
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    try:
        fd = files.open_regular(path, flags, 0o600)
        if os.fstat(fd).st_uid != os.geteuid():  # an older layout's user-owned log
            os.close(fd)
            os.unlink(path)
            fd = files.open_regular(path, flags | os.O_EXCL, 0o600)
    except (OSError, files.UnsafeFileError) as exc:
        log.get().error("supervisor.log_unavailable", path=str(path), error=str(exc))
        return None
    if os.geteuid() == 0 and uid > 0:
        files.grant_read(fd, uid)
    return fd


def _current_attempt(state: JobState) -> int:
    from wrapper.job.store import JobStore

    return JobStore(state).current_attempt()


# Checks whose failure during a run means the GPU under the job is faulty now (the
# others, such as memory in use, are expected while a job runs).


def _gpu_fault_reader(cfg: Config, record: JobRecord) -> Callable[[], list[str]] | None:
    """GPU faults on the job's GPUs, through the same probe and checks as the prolog."""
    if not record.gpus:
        return None
    from wrapper.gpu import faults

    def read() -> list[str]:
        try:
            return [faults.describe(r) for r in faults.read(cfg, record.first_node, record.gpus)]
        except JobwrapError as exc:  # the probe, not the GPU: keep watching
            log.get().warning("supervisor.gpu_unreadable", error=str(exc))
            return []

    return read


def _forensics_waiter(cfg: Config, state: JobState, attempt: int) -> Callable[[], None] | None:
    """Wait (bounded) until every node's watcher of ``attempt`` recorded its forensics."""
    budget = cfg.supervisor.forensics_timeout
    if budget <= 0 or not cfg.supervisor.node_watch:
        return None

    def wait() -> None:
        end = time.monotonic() + budget
        while True:
            events = [e for e in JobStore(state).root_events() if e.attempt == attempt]
            watched = {e.node for e in events if isinstance(e, ev.WatchStarted)}
            done = {e.node for e in events if isinstance(e, ev.WatchForensics)}
            if watched <= done or time.monotonic() >= end:
                log.get().info("supervisor.forensics", nodes=sorted(map(str, done)),
                               missing=sorted(map(str, watched - done)))
                return
            time.sleep(0.5)

    return wait
