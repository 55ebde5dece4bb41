"""What a supervisor costs slurmctld: at steady state at most one call per job per minute.

The real Supervisor loop (wrapper/supervisor/monitor.py) with the real ``job_state`` the
``supervise`` verb gives it (launch.SlurmLook), on real state files, a fake clock, and
the fake Slurm backend (wrapper/slurm/fake.py) behind a counter of every call made to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wrapper.config import SupervisorConfig
from wrapper.errors import SlurmError
from wrapper.job.record import JobRecord
from wrapper.job.state import USER_EVENTS, JobState
from wrapper.slurm.fake import FakeSlurm
from wrapper.supervisor.launch import SlurmLook
from wrapper.supervisor.monitor import Supervisor

JOB = "4242"


class Counted:
    """Any backend, every method call counted (a call to Slurm is a call to slurmctld)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.calls: list[tuple[float, str]] = []
        self.clock = lambda: 0.0

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.backend, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((self.clock(), name))
            return target(*args, **kwargs)
        return call


class Clock:
    def __init__(self) -> None:
        self.now = 5_000_000.0

    def __call__(self) -> float:
        return self.now


def supervised(tmp_path: Path, fake: FakeSlurm, *, unreachable_after: float = 600.0
               ) -> tuple[Supervisor, JobState, Clock, Counted]:
    state = JobState(tmp_path / "state", JOB)
    state.prepare(None, None)
    (state.path / USER_EVENTS).write_text("")
    out = tmp_path / "job.out"
    out.write_text("")
    clock = Clock()
    record = JobRecord(job_id=JOB, user="u", uid=1, gid=1, nodes=["n1"], gpus=[0],
                       work_dir=str(tmp_path), stdout=str(out), stderr=str(out),
                       time_limit_s=None, start_time=clock.now,
                       options={"checkpoint_dir": str(tmp_path / "ckpt")})
    counted = Counted(fake)
    counted.clock = clock
    look = SlurmLook(counted, JOB, state, 0, unreachable_after=unreachable_after,
                     ask_every=SupervisorConfig().slurm_ask_every, clock=clock)
    # the defaults: a look every 2 s, "ask Slurm" every 10 s; the ask is what is bounded
    sup = Supervisor(record, state, SupervisorConfig(), options=record.job_options, attempt=0,
                     job_state=look,
                     end_job=lambda why: True, signal_job=lambda sig: True, clock=clock)
    return sup, state, clock, counted


def run_for(sup: Supervisor, clock: Clock, seconds: float) -> None:
    end = clock.now + seconds

    def sleep(step: float) -> None:
        clock.now += step
        if clock.now >= end:
            sup.finished = True  # the test's stop, not the supervisor's

    sup.run(sleep=sleep)


def per_minute(calls: list[tuple[float, str]], start: float, minutes: int) -> list[int]:
    return [sum(1 for t, _ in calls if start + 60 * m <= t < start + 60 * (m + 1))
            for m in range(minutes)]


def test_a_running_job_costs_slurmctld_one_call_a_minute(tmp_path: Path) -> None:
    fake = FakeSlurm(jobs={JOB: {"JobState": "RUNNING"}})
    sup, _state, clock, counted = supervised(tmp_path, fake)
    start = clock.now
    run_for(sup, clock, 10 * 60)
    assert not any(e["event"] == "supervisor.end" for e in _state.events())
    counts = per_minute(counted.calls, start, 10)
    assert max(counts) <= 1, counts
    assert sum(counts) >= 9  # it does ask: a job gone without an epilog is still seen
    assert {name for _, name in counted.calls} == {"job_state_and_limit"}
    gaps = [b[0] - a[0] for a, b in zip(counted.calls, counted.calls[1:], strict=False)]
    assert min(gaps) >= SupervisorConfig().slurm_ask_every == 60


def test_the_job_end_is_seen_from_roots_epilog_event_without_asking(tmp_path: Path) -> None:
    fake = FakeSlurm(jobs={JOB: {"JobState": "RUNNING"}})
    sup, state, clock, counted = supervised(tmp_path, fake)
    run_for(sup, clock, 90)
    asked = len(counted.calls)
    state.append("epilog.context", attempt=0, node="n1")  # root's: the job ended here
    clock.now += 11
    sup.tick()
    assert sup.finished
    assert len(counted.calls) == asked
    assert [e["job_state"] for e in state.events() if e["event"] == "supervisor.end"] == \
        ["COMPLETING"]


def test_the_users_forged_epilog_event_ends_nothing(tmp_path: Path) -> None:
    fake = FakeSlurm(jobs={JOB: {"JobState": "RUNNING"}})
    sup, state, clock, _counted = supervised(tmp_path, fake)
    sup.tick()
    state.append("epilog.context", as_user=True, attempt=0, node="n1")
    run_for(sup, clock, 120)
    assert not any(e["event"] == "supervisor.end" for e in state.events())


def test_an_unreachable_slurmctld_is_not_asked_more_often(tmp_path: Path) -> None:
    class Down(FakeSlurm):
        def job_state_and_limit(self, job_id: str) -> tuple[str, str]:
            raise SlurmError("slurm_load_jobs error: Unable to contact slurm controller")

    sup, state, clock, counted = supervised(tmp_path, Down(), unreachable_after=300)
    start = clock.now
    run_for(sup, clock, 10 * 60)
    ends = [e["job_state"] for e in state.events() if e["event"] == "supervisor.end"]
    assert ends == ["UNREACHABLE"]  # after 300 s unanswered, then it stopped asking
    counts = per_minute(counted.calls, start, 10)
    assert max(counts) <= 1, counts
    assert 5 <= sum(counts) <= 7


def test_a_node_watcher_asks_slurmctld_once_in_ten_minutes_and_never_at_start(
        tmp_path: Path) -> None:
    """Every node of a job runs a watcher: on a 1,000-node job, a watcher asking as often
    as a supervisor would be 1,000 calls at start and 17 a second after. The watcher's
    look (wrapper/watch/process.py) waits WATCH_ASK_EVERY, and root's epilog.context on
    its node ends it without asking."""
    from wrapper.job import events as ev
    from wrapper.watch.process import WATCH_ASK_EVERY

    state = JobState(tmp_path / "state", JOB)
    state.prepare(None, None)
    clock = Clock()
    slurm = Counted(FakeSlurm(jobs={JOB: {"JobId": JOB, "JobState": "RUNNING"}}))
    slurm.clock = clock
    look = SlurmLook(slurm, JOB, state, 0, unreachable_after=600.0,
                     ask_every=WATCH_ASK_EVERY, ask_at_once=False, clock=clock)
    start = clock.now
    for _ in range(int(3 * WATCH_ASK_EVERY / 10)):  # a look every 10 s for 30 minutes
        assert look() == "RUNNING"
        clock.now += 10
    asked = [t - start for t, _ in slurm.calls]
    assert WATCH_ASK_EVERY >= 600 and len(asked) == 2, asked
    assert asked[0] >= WATCH_ASK_EVERY  # none at start
    state.append(ev.EpilogContext.KIND, attempt=0, node="n1", hook="epilog")
    assert look() == "COMPLETING" and len(slurm.calls) == 2


def test_a_time_limit_changed_while_the_job_runs_is_followed_at_no_extra_call(
        tmp_path: Path) -> None:
    """``scontrol update JobId= TimeLimit=`` while the job runs: the supervisor's one
    request a minute carries the limit, and the walltime signal follows the new one."""
    fake = FakeSlurm(jobs={JOB: {"JobState": "RUNNING", "TimeLimit": "2:00:00"}})
    sup, state, clock, counted = supervised(tmp_path, fake)
    look = sup.job_state
    assert isinstance(look, SlurmLook)
    sup.time_limit = lambda: look.time_limit_s
    start = clock.now
    run_for(sup, clock, 120)
    assert look.time_limit_s == 7200
    assert not any(e["event"] == "walltime.signal" for e in state.events())
    fake.jobs[JOB]["TimeLimit"] = "6:00"  # lowered to 6 min: 4 min left, inside the lead
    sup.finished = False
    run_for(sup, clock, 70)
    assert look.time_limit_s == 360
    [signalled] = [e for e in state.events() if e["event"] == "walltime.signal"]
    assert 0 < signalled["seconds_left"] <= 360 - 120
    assert {name for _, name in counted.calls} == {"job_state_and_limit"}
    assert max(per_minute(counted.calls, start, 4)) <= 1
    for unread in ("INVALID", "NOT_SET", ""):  # no limit in the answer: the last one holds
        fake.jobs[JOB]["TimeLimit"] = unread
        look._follow_limit(unread)
        assert look.time_limit_s == 360
    look._follow_limit("UNLIMITED")
    assert look.time_limit_s is None
