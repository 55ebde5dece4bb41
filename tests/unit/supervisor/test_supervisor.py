"""The supervisor's decisions, driven tick by tick with a fake clock on real files."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from wrapper.config import SupervisorConfig
from wrapper.job.record import JobRecord
from wrapper.job.state import USER_EVENTS, JobState
from wrapper.supervisor.monitor import LEARN_AFTER, Supervisor


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def write_ckpt(directory: Path, step: int, mtime: float) -> None:
    import os

    path = directory / f"epoch=0-step={step}.ckpt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("state.json", json.dumps({"step": step}))
    os.utime(path, (mtime, mtime))


def make(tmp_path: Path, *, hang: float | None = 30, time_limit: float | None = None,
         asked_signal: bool = False, faults: list[str] | None = None,
         cfg: SupervisorConfig | None = None):  # type: ignore[no-untyped-def]
    state = JobState(tmp_path / "state", "77")
    state.prepare(None, None)
    (state.path / USER_EVENTS).write_text("")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    out = tmp_path / "job.out"
    out.write_text("")
    clock = Clock()
    record = JobRecord(job_id="77", user="u", uid=1, gid=1, nodes=["n1"], gpus=[0],
                       work_dir=str(tmp_path), stdout=str(out), stderr=str(out),
                       time_limit_s=time_limit, start_time=clock.now, asked_signal=asked_signal,
                       options={"checkpoint_dir": str(ckpt),
                                "hang_timeout": hang})
    calls: dict[str, list[str]] = {"end": [], "signal": []}
    slurm_state = {"value": "RUNNING"}

    def end(why: str) -> bool:
        calls["end"].append(why)
        return True

    def signal(sig: str) -> bool:
        calls["signal"].append(sig)
        return True

    sup = Supervisor(record, state, cfg or SupervisorConfig(settle_seconds=5),
                     options=record.job_options, attempt=0,
                     job_state=lambda: slurm_state["value"],
                     end_job=end, signal_job=signal,
                     gpu_faults=(lambda: list(faults)) if faults is not None else None,
                     clock=clock)
    return sup, state, clock, ckpt, out, calls, slurm_state


def events(state: JobState) -> list[str]:
    return [e["event"] for e in state.events()]


def test_checkpoints_are_progress(tmp_path: Path) -> None:
    sup, state, clock, ckpt, _out, calls, _ = make(tmp_path)
    write_ckpt(ckpt, 1, clock.now - 60)
    sup.tick()
    clock.now += 20
    write_ckpt(ckpt, 2, clock.now - 6)
    sup.tick()
    clock.now += 20  # 40 s since the first checkpoint, 20 since the second: no hang
    sup.tick()
    found = [e for e in state.events() if e["event"] == "checkpoint"]
    assert [e["step"] for e in found] == [1, 2]
    assert calls["end"] == []


def test_a_checkpoint_still_being_written_is_not_progress(tmp_path: Path) -> None:
    sup, state, clock, ckpt, _out, _calls, _ = make(tmp_path)
    write_ckpt(ckpt, 1, clock.now - 1)  # modified 1 s ago, settle is 5 s
    sup.tick()
    assert "checkpoint" not in events(state)


def test_hang_ends_the_job_once(tmp_path: Path) -> None:
    sup, state, clock, _ckpt, out, calls, _ = make(tmp_path, hang=30)
    sup.tick()
    clock.now += 20
    out.write_text("step 1\n")  # output is progress too
    sup.tick()
    clock.now += 25
    sup.tick()
    assert calls["end"] == []
    clock.now += 10  # 35 s without output or checkpoint
    sup.tick()
    sup.tick()
    assert calls["end"] == ["hang"]
    hang = [e for e in state.events() if e["event"] == "hang"]
    assert len(hang) == 1 and hang[0]["idle_s"] >= 30 and hang[0]["source"] == "user"


def test_hang_timeout_off_means_no_hang(tmp_path: Path) -> None:
    sup, state, clock, *_ = make(tmp_path, hang=0.0)  # --hang-timeout=off
    clock.now += 10_000_000
    sup.tick()
    assert "hang" not in events(state)


def test_without_hang_timeout_the_floor_holds_until_there_is_history(tmp_path: Path) -> None:
    cfg = SupervisorConfig(settle_seconds=5, hang_floor=100, hang_k=3)
    sup, _state, clock, _ckpt, out, calls, _ = make(tmp_path, hang=None, cfg=cfg)
    sup.tick()
    clock.now += 99  # a slow start-up (imports, data loading) is not a hang
    out.write_text("started\n")
    sup.tick()
    assert sup.hang_timeout == 100  # the start-up gap is no cadence
    clock.now += 99
    sup.tick()
    assert calls["end"] == []
    clock.now += 2
    sup.tick()
    assert calls["end"] == ["hang"]


def test_without_hang_timeout_the_cadence_is_learned(tmp_path: Path) -> None:
    cfg = SupervisorConfig(settle_seconds=5, hang_floor=30, hang_k=3)
    sup, state, clock, _ckpt, out, calls, _ = make(tmp_path, hang=None, cfg=cfg)
    sup.tick()
    for step, gap in enumerate([5, 5, 20, 5], start=1):  # one slow step (an eval, say)
        clock.now += gap
        out.write_text("step\n" * step)
        sup.tick()
    assert sup.hang_timeout == 60  # 3 x the longest gap (20 s), above the 30 s floor
    clock.now += 59
    sup.tick()
    assert calls["end"] == []
    clock.now += 1
    sup.tick()
    assert calls["end"] == ["hang"]
    hang = next(e for e in state.events() if e["event"] == "hang")
    assert hang["learned"] is True and hang["cadence_s"] == 20 and hang["hang_timeout_s"] == 60


def test_a_fast_cadence_never_goes_below_the_floor(tmp_path: Path) -> None:
    cfg = SupervisorConfig(settle_seconds=5, hang_floor=30, hang_k=3)
    sup, _state, clock, _ckpt, out, calls, _ = make(tmp_path, hang=None, cfg=cfg)
    sup.tick()
    for step in range(1, 5):
        clock.now += 1
        out.write_text("s\n" * step)
        sup.tick()
    assert sup.hang_timeout == 30
    clock.now += 29
    sup.tick()
    assert calls["end"] == []


def _steady(sup: Supervisor, clock: Clock, out: Path, gaps: int, every: float = 2,
            ckpt: Path | None = None) -> None:
    """``gaps`` gaps of ``every`` s between output lines; with ``ckpt``, a checkpoint saved
    (and settled) at the first of them, while the supervisor watches."""
    for step in range(1, gaps + 2):  # the first sign of progress ends the start-up
        clock.now += every
        out.write_text("s\n" * step)
        if ckpt is not None and step == 1:
            write_ckpt(ckpt, step, clock.now - 10)
        sup.tick()


LEARNING = {"settle_seconds": 5, "hang_floor": 1800, "hang_min": 300, "hang_k": 3}


def test_once_the_cadence_is_learned_the_floor_drops_to_hang_min(tmp_path: Path) -> None:
    sup, state, clock, ckpt, out, calls, _ = make(tmp_path, hang=None,
                                                  cfg=SupervisorConfig(**LEARNING))
    sup.tick()
    _steady(sup, clock, out, LEARN_AFTER - 1, ckpt=ckpt)
    assert not sup.cadence_learned and sup.hang_timeout == 1800  # not trusted yet
    _steady(sup, clock, out, 1)
    assert sup.cadence_learned and sup.hang_timeout == 300  # 3 x 2 s is under hang_min
    clock.now += 299
    sup.tick()
    assert calls["end"] == []
    clock.now += 2
    sup.tick()
    assert calls["end"] == ["hang"]
    hang = next(e for e in state.events() if e["event"] == "hang")
    assert hang["hang_timeout_s"] == 300 and hang["learned"] is True


def test_start_up_chatter_without_a_save_teaches_no_cadence(tmp_path: Path) -> None:
    # a progress bar while the data downloads: many gaps, but no save seen yet, so a
    # long silent first save or compile after it is no hang before hang_floor
    sup, _state, clock, ckpt, out, calls, _ = make(tmp_path, hang=None,
                                                   cfg=SupervisorConfig(**LEARNING))
    write_ckpt(ckpt, 7, clock.now - 60)  # the checkpoint it resumed from: no save watched
    sup.tick()
    _steady(sup, clock, out, 3 * LEARN_AFTER)
    assert not sup.cadence_learned and sup.hang_timeout == 1800
    clock.now += 1000
    sup.tick()
    assert calls["end"] == []


def test_a_checkpoint_found_at_the_first_look_is_no_progress(tmp_path: Path) -> None:
    # the checkpoint the attempt resumes from was there before it: the start-up after it
    # (imports, loading it) is no gap of the job's cadence, and no sign the command runs
    cfg = SupervisorConfig(settle_seconds=5, hang_floor=30, hang_k=3)
    sup, state, clock, ckpt, out, calls, _ = make(tmp_path, hang=None, cfg=cfg)
    write_ckpt(ckpt, 7, clock.now - 60)
    sup.tick()
    assert sup.seen.progress_count == 0
    assert [e["step"] for e in state.events() if e["event"] == "checkpoint"] == [7]
    clock.now += 25  # a slow start-up
    out.write_text("step 8\n")
    sup.tick()
    for step in range(9, 13):
        clock.now += 1
        out.write_text("step\n" * step)
        sup.tick()
    assert sup.seen.longest_gap == 1 and sup.hang_timeout == 30  # not 3 x 25 s
    clock.now += 31
    sup.tick()
    assert calls["end"] == ["hang"]


def test_a_learned_cadence_above_hang_min_still_rules(tmp_path: Path) -> None:
    sup, _state, clock, ckpt, out, _calls, _ = make(tmp_path, hang=None,
                                                    cfg=SupervisorConfig(**LEARNING))
    sup.tick()
    _steady(sup, clock, out, LEARN_AFTER, every=150, ckpt=ckpt)  # a slow job: 150 s a step
    assert sup.hang_timeout == 450


def test_a_restarted_command_starts_under_the_floor_then_keeps_its_cadence(
        tmp_path: Path) -> None:
    sup, _state, clock, ckpt, out, _calls, _ = make(tmp_path, hang=None,
                                                    cfg=SupervisorConfig(**LEARNING))
    killed = _under_run(sup, runs=True, steps=["77.0"])
    sup.tick()
    _steady(sup, clock, out, LEARN_AFTER, ckpt=ckpt)
    clock.now += 301
    sup.tick()
    assert killed == [1]  # restarted in place
    assert sup.hang_timeout == 1800  # its start-up (checkpoint load, NCCL) is not a hang
    clock.now += 200
    out.write_text(out.read_text() + "resumed\n")
    sup.tick()
    assert sup.hang_timeout == 300  # the same job, running again: its cadence holds


def test_a_restart_by_jobwrap_run_restarts_the_start_up_clock(tmp_path: Path) -> None:
    restarts = [0]
    sup, _state, clock, ckpt, out, calls, _ = make(tmp_path, hang=None,
                                                   cfg=SupervisorConfig(**LEARNING))
    sup.run_restarts = lambda: restarts[0]
    sup.tick()
    _steady(sup, clock, out, LEARN_AFTER, ckpt=ckpt)
    assert sup.hang_timeout == 300
    restarts[0] = 1  # the command crashed and jobwrap run started it again
    clock.now += 250
    sup.tick()  # a look at Slurm's pace reads jobwrap run's restarts
    assert sup.hang_timeout == 1800
    clock.now += 400
    sup.tick()
    assert calls["end"] == []  # 650 s without output, but a fresh start-up


def test_walltime_signal_before_the_limit(tmp_path: Path) -> None:
    sup, state, clock, _ckpt, _out, calls, _ = make(tmp_path, hang=0.0, time_limit=3600)
    clock.now += 3000
    sup.tick()
    assert calls["signal"] == []
    clock.now += 400  # 200 s left < 300 s lead
    sup.tick()
    sup.tick()
    assert calls["signal"] == ["URG"]
    assert events(state).count("walltime.signal") == 1


def test_no_walltime_signal_when_the_job_asked_for_one(tmp_path: Path) -> None:
    sup, _state, clock, _ckpt, _out, calls, _ = make(tmp_path, hang=0.0, time_limit=600,
                                                       asked_signal=True)
    clock.now += 590
    sup.tick()
    assert calls["signal"] == []


def test_gpu_fault_ends_the_job(tmp_path: Path) -> None:
    faults: list[str] = []
    sup, state, clock, _ckpt, _out, calls, _ = make(tmp_path, hang=0.0, faults=faults)
    sup.tick()
    faults.append("xid 79 on gpu 0")
    clock.now += 11
    sup.tick()
    assert calls["end"] == ["gpu.fault"]
    assert [e["reason"] for e in state.events() if e["event"] == "gpu.fault"] == \
        ["xid 79 on gpu 0"]


def test_ends_when_the_job_leaves_running(tmp_path: Path) -> None:
    sup, state, clock, _ckpt, _out, _calls, slurm_state = make(tmp_path)
    sup.tick()
    assert not sup.finished
    slurm_state["value"] = "COMPLETING"
    clock.now += 11
    sup.tick()
    assert sup.finished
    assert events(state)[-1] == "supervisor.end"


def test_run_loop_with_fake_sleep(tmp_path: Path) -> None:
    sup, state, clock, _ckpt, _out, _calls, slurm_state = make(tmp_path)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock.now += seconds
        if len(sleeps) == 6:
            slurm_state["value"] = ""

    sup.run(sleep=sleep)
    assert events(state)[0] == "supervisor.start" and events(state)[-1] == "supervisor.end"
    assert all(s == 2.0 for s in sleeps)


def test_walltime_signal_is_retried_until_a_step_gets_it(tmp_path: Path) -> None:
    sup, state, clock, _ckpt, _out, _calls, _ = make(tmp_path, hang=0.0, time_limit=60)
    delivered: list[bool] = [False, False, True]
    tries: list[str] = []

    def signal(sig: str) -> bool:
        tries.append(sig)
        return delivered[len(tries) - 1]

    sup.signal_job = signal
    for _ in range(5):
        clock.now += 2
        sup.tick()
    assert tries == ["URG", "URG", "URG"]
    assert events(state).count("walltime.signal") == 1


def test_a_later_attempt_ends_this_supervisor(tmp_path: Path) -> None:
    sup, state, clock, *_ = make(tmp_path)
    sup.tick()
    assert not sup.finished
    state.append("prolog.context", attempt=1, node="n2")  # Slurm requeued and restarted it
    clock.now += 11
    sup.tick()
    assert sup.finished
    assert [e["job_state"] for e in state.events() if e["event"] == "supervisor.end"] == \
        ["REQUEUED"]


def test_a_hang_waits_for_the_forensics_before_ending_the_job(tmp_path: Path) -> None:
    sup, _state, clock, _ckpt, _out, calls, _ = make(tmp_path, hang=30)
    order: list[str] = []
    sup.await_forensics = lambda: order.append(f"forensics, ended: {calls['end']}")
    sup.tick()
    clock.now += 31
    sup.tick()
    assert order == ["forensics, ended: []"] and calls["end"] == ["hang"]


def test_before_the_limit_the_job_is_asked_to_save_and_requeued_once_it_has(
        tmp_path: Path) -> None:
    sup, state, clock, ckpt, _out, calls, _ = make(tmp_path, hang=0.0, time_limit=3600)
    requeues: list[float] = []
    sup.requeue_job = lambda: requeues.append(clock.now) or True
    save = ckpt / ".jobwrap-save-now"
    save.write_text("")  # an earlier attempt's request: not this one's
    sup.remove_save_file()
    assert not save.exists()
    write_ckpt(ckpt, 100, clock.now - 60)
    clock.now += 3400  # 200 s left
    sup.tick()
    assert calls["signal"] == ["URG"] and save.exists()  # any loop can poll it
    [signalled] = [e for e in state.events() if e["event"] == "walltime.signal"]
    assert signalled["save_file"] == str(save)
    clock.now += 20
    sup.tick()
    assert requeues == []  # the checkpoint it had before the request does not count
    write_ckpt(ckpt, 110, clock.now - 6)  # saved on the request, settled (5 s)
    clock.now += 2
    sup.tick()
    assert requeues == [clock.now]
    [done] = [e for e in state.events() if e["event"] == "walltime.requeued"]
    assert done["checkpoint"].endswith("step=110.ckpt") and done["seconds_left"] == 178
    write_ckpt(ckpt, 120, clock.now - 6)
    clock.now += 2
    sup.tick()
    assert len(requeues) == 1  # once


def test_no_requeue_on_a_save_for_a_job_that_may_not_be_requeued(tmp_path: Path) -> None:
    sup, _state, clock, ckpt, _out, calls, _ = make(tmp_path, hang=0.0, time_limit=3600)
    assert sup.requeue_job is None  # launch passes none: --no-requeue, restarts spent, off
    clock.now += 3400
    sup.tick()
    write_ckpt(ckpt, 110, clock.now - 6)
    clock.now += 2
    sup.tick()
    assert calls["signal"] == ["URG"] and (ckpt / ".jobwrap-save-now").exists()


def _following_the_limit(tmp_path: Path, limit_s: float):  # type: ignore[no-untyped-def]
    """A supervisor whose ``time_limit`` is what Slurm says now (``limit["s"]``), and
    that records its requeues."""
    sup, state, clock, ckpt, _out, calls, _ = make(tmp_path, hang=0.0, time_limit=limit_s)
    limit: dict[str, float | None] = {"s": limit_s}
    sup.time_limit = lambda: limit["s"]
    requeues: list[float] = []
    sup.requeue_job = lambda: requeues.append(clock.now) or True
    return sup, state, clock, ckpt, calls, limit, requeues


def test_a_lowered_time_limit_moves_the_save_and_the_requeue_before_it(
        tmp_path: Path) -> None:
    """The limit Slurm gives now (lowered with scontrol update while the job runs), not
    the one the job started with, decides when the job is asked to save."""
    sup, state, clock, ckpt, calls, limit, requeues = _following_the_limit(tmp_path, 36000)
    clock.now += 600
    sup.tick()
    assert calls["signal"] == []
    limit["s"] = 1000  # 400 s left: inside the 300 s lead once 100 s more have passed
    clock.now += 10
    sup.tick()
    assert calls["signal"] == []
    clock.now += 100
    sup.tick()
    assert calls["signal"] == ["URG"] and (ckpt / ".jobwrap-save-now").exists()
    [signalled] = [e for e in state.events() if e["event"] == "walltime.signal"]
    assert signalled["seconds_left"] == 290
    write_ckpt(ckpt, 7, clock.now - 6)
    clock.now += 2
    sup.tick()
    [done] = [e for e in state.events() if e["event"] == "walltime.requeued"]
    assert requeues == [clock.now] and done["seconds_left"] == 288


def test_a_limit_raised_after_the_save_request_withdraws_it(tmp_path: Path) -> None:
    sup, state, clock, ckpt, calls, limit, requeues = _following_the_limit(tmp_path, 600)
    clock.now += 400
    sup.tick()
    assert calls["signal"] == ["URG"] and (ckpt / ".jobwrap-save-now").exists()
    limit["s"] = 3600  # raised before the job saved: no early requeue for a limit gone
    clock.now += 2
    sup.tick()
    assert not (ckpt / ".jobwrap-save-now").exists()
    write_ckpt(ckpt, 7, clock.now - 6)
    clock.now += 2
    sup.tick()
    assert requeues == [] and calls["signal"] == ["URG"]
    clock.now = sup.record.start_time + 3600 - 200  # the new limit's lead: asked again
    sup.tick()
    assert calls["signal"] == ["URG", "URG"] and (ckpt / ".jobwrap-save-now").exists()
    assert [e["event"] for e in state.events()].count("walltime.signal") == 2


def _under_run(sup: Supervisor, *, runs: bool, steps: list[str]) -> list[int]:
    killed: list[int] = []

    def kill() -> list[str]:
        killed.append(1)
        return list(steps)

    sup.under_run = lambda: runs
    sup.kill_steps = kill
    return killed


def test_a_hang_under_jobwrap_run_ends_only_the_steps_and_is_followed_again(
        tmp_path: Path) -> None:
    sup, state, clock, _ckpt, out, calls, _ = make(tmp_path, hang=30)
    facts: list[dict[str, object]] = []
    sup.facts = facts.append
    order: list[str] = []
    sup.await_forensics = lambda: order.append("forensics")
    killed = _under_run(sup, runs=True, steps=["77.0"])
    sup.tick()
    clock.now += 31
    sup.tick()
    assert order == ["forensics"] and killed == [1] and calls["end"] == []
    assert [f["event"] for f in facts] == ["hang", "hang.in_place"]  # root reads both
    [in_place] = [e for e in state.events() if e["event"] == "hang.in_place"]
    assert in_place["steps"] == ["77.0"] and in_place["attempt"] == 0
    clock.now += 20  # the restarted command: its hang timeout counts from the restart
    sup.tick()
    assert killed == [1]
    out.write_text("step 4\n")
    sup.tick()
    clock.now += 31
    sup.tick()  # it hangs again: the same again; jobwrap run's brakes decide
    assert killed == [1, 1] and calls["end"] == []


def test_a_hang_is_ended_as_before_without_jobwrap_run_or_without_steps(
        tmp_path: Path) -> None:
    for runs, steps in ((False, ["77.0"]), (True, [])):
        base = tmp_path / f"{runs}-{len(steps)}"
        base.mkdir()
        sup, state, clock, *_rest, calls, _ = make(base, hang=30)
        killed = _under_run(sup, runs=runs, steps=steps)
        sup.tick()
        clock.now += 31
        sup.tick()
        assert calls["end"] == ["hang"] and killed == ([1] if runs else [])
        assert "hang.in_place" not in events(state)
