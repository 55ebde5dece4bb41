"""One watcher: a plain tick loop (tests drive it with a fake clock) over injected readers."""

from __future__ import annotations

import time
from collections.abc import Callable

from wrapper import log
from wrapper.fastdataclass import dataclass

RUNNING = {"RUNNING", "CONFIGURING", "SUSPENDED", "STOPPED", "COMPLETING"}


@dataclass(frozen=True)
class Fault:
    """A fault on one of the node's allocated GPUs: what failed, and the drain reason."""

    check: str
    gpu: int | None
    reason: str  # "jobwrap: xid gpu0(GPU-...): ...", the node's drain reason


class Watcher:
    """Follows one attempt of one job on one node, as root."""

    def __init__(self, *, job_id: str, node: str, attempt: int, interval: float,
                 slurm_interval: float, slurm_unreachable: float,
                 read_faults: Callable[[], list[Fault]],
                 job_state: Callable[[], str | None],
                 superseded: Callable[[], bool],
                 on_fault: Callable[[list[Fault]], None],
                 forensics: Callable[[], object] | None = None,
                 keep: Callable[[], object] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.job_id, self.node, self.attempt = job_id, node, attempt
        self.interval, self.slurm_interval = interval, slurm_interval
        self.slurm_unreachable = slurm_unreachable
        self.read_faults, self.job_state, self.superseded = read_faults, job_state, superseded
        self.on_fault = on_fault
        self.forensics = forensics  # each tick: takes the hang forensics once when asked
        self.keep = keep  # each tick: the supervisor kept alive (the first node's watcher)
        self.clock = clock
        self.finished = ""  # why it stopped; empty while it watches
        self.acted = False
        self._next_gpu = 0.0
        self._next_slurm = clock() + slurm_interval  # the prolog just saw the job start
        self._unreachable_since: float | None = None

    def tick(self) -> None:
        now = self.clock()
        if self.forensics is not None:
            self.forensics()
        if self.keep is not None and not self.acted:
            self.keep()
        if now >= self._next_gpu and not self.acted:
            self._next_gpu = now + self.interval
            faults = self.read_faults()
            if faults:
                self.acted = True
                self.on_fault(faults)
        if now >= self._next_slurm:
            self._next_slurm = now + self.slurm_interval
            self._look_at_slurm(now)

    def _look_at_slurm(self, now: float) -> None:
        current = self.job_state()
        if current is None:  # Slurm did not answer
            if self._unreachable_since is None:
                self._unreachable_since = now
            if now - self._unreachable_since >= self.slurm_unreachable:
                self.finished = "slurm unreachable"
            return
        self._unreachable_since = None
        if current not in RUNNING:
            self.finished = f"job {current or 'gone'}"
        elif self.superseded():
            self.finished = "a later attempt runs"

    def run(self, sleep: Callable[[float], object], stopped: Callable[[], bool]) -> str:
        """Tick until the job ends or ``stopped``; returns why it stopped."""
        while not self.finished and not stopped():
            self.tick()
            if not self.finished:
                sleep(min(self.interval, self.slurm_interval))
        why = self.finished or "stopped by the epilog"
        log.get().info("watch.end", why=why)
        return why
