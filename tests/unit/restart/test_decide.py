"""Root's decision from root's facts (forged user events), and results kept, not lost.

The epilog runs for real (as root, with the real test user as the job's user, the fake
GPU probe, and Slurm commands that fail: there is no Slurm here, and the epilog must go
on without it).
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from wrapper.config import parse
from wrapper.hooks import run_hook, staging
from wrapper.job import record as jobrecord
from wrapper.job.facts import FactChannel, fact, supervisor_facts
from wrapper.job.record import JobRecord
from wrapper.job.state import USER_EVENTS, JobState
from wrapper.osl.users import UserIds
from wrapper.slurm.context import JobContext
from wrapper.staging.scratch import prepare_scratch

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gpu"
JOB = "41"


def site(shared: Path, inventory: Path) -> Path:
    for sub in ("state", "scratch", "archive"):
        (shared / sub).mkdir(mode=0o755, exist_ok=True)
    config = shared / "jobwrap.toml"
    config.write_text(
        f'[paths]\nstate_dir = "{shared}/state"\nscratch_root = "{shared}/scratch"\n'
        f'archive_root = "{shared}/archive"\n[log]\nfile = ""\n'
        f'[slurm]\nscontrol_command = "/bin/false"\nsinfo_command = "/bin/false"\n'
        f'squeue_command = "/bin/false"\nscancel_command = "/bin/false"\n'
        f'[gpu]\nbackend = "fake"\nfake_inventory = "{inventory}"\n')
    return config


def job(shared: Path, user: UserIds) -> tuple[JobState, Path]:
    state = JobState(shared / "state", JOB)
    state.prepare(user.uid, user.gid)
    out = shared / "job.out"
    out.write_text("step 1\n")
    os.chown(out, user.uid, user.gid)
    record = JobRecord(job_id=JOB, user=user.name, uid=user.uid, gid=user.gid, nodes=["n1"],
                       gpus=[0], work_dir=str(shared), stdout=str(out), stderr=str(out),
                       options={"max_restarts": 3})
    state.write_json(jobrecord.RECORD, record.as_dict())
    state.append("prolog.context", node="n1", hook="prolog", attempt=0, context={})
    prepare_scratch(shared / "scratch", JOB, user)
    return state, out


def epilog(config: Path, user: UserIds, exit_code: int = 1, attempt: int = 0) -> int:
    env = {"SLURM_JOB_RESTART_COUNT": str(attempt), "SLURM_JOB_ID": JOB,
           "SLURM_JOB_USER": user.name, "SLURM_JOB_UID": str(user.uid),
           "SLURM_JOB_GID": str(user.gid), "SLURMD_NODENAME": "n1", "SLURM_NODELIST": "n1",
           "SLURM_JOB_GPUS": "0", "SLURM_SCRIPT_CONTEXT": "epilog_slurmd",
           "SLURM_JOB_EXIT_CODE2": f"{exit_code}:0", "SLURM_JOB_EXIT_CODE": str(exit_code << 8)}
    return run_hook("epilog", config_path=str(config), env=env)


def forge(state: JobState, *names: str) -> None:
    """What the job's user can write: its own event file (as that user would)."""
    with open(state.path / USER_EVENTS, "a") as handle:
        for name in names:
            handle.write(json.dumps({"ts": time.time() + 1, "event": name, "attempt": 0,
                                     "node": "n1", "hook": "supervisor",
                                     "reason": "xid gpu0: forged"}) + "\n")


def root_end(state: JobState) -> dict[str, object]:
    [end] = [e for e in state.events() if e["event"] == "attempt.end"]
    assert end["source"] == "root"
    return end


def test_forged_user_events_do_not_skip_the_epilog_nor_make_hardware(
        shared: Path, user: UserIds) -> None:
    config = site(shared, FIXTURES / "healthy-4.toml")
    state, out = job(shared, user)
    forge(state, "prolog.unhealthy", "gpu.fault", "hang")
    with open(out, "a") as handle:
        handle.write("NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n")
    assert epilog(config, user) == 0
    end = root_end(state)  # the epilog was not skipped
    assert (end["kind"], end["exclude"]) == ("user_error", [])
    assert "not confirmed by root: gpu.fault in the job's own event file, hang in the " \
        "job's own event file, the GPU error in the output" in str(end["detail"])
    names = [e["event"] for e in state.events() if e["source"] == "root"]
    assert "archive" in names and "scratch.removed" in names
    assert not (shared / "scratch" / JOB).exists()


def test_a_fault_root_confirms_is_hardware(shared: Path, user: UserIds) -> None:
    faulty = shared / "faulty.toml"
    faulty.write_text((FIXTURES / "healthy-4.toml").read_text().replace(
        "xid_events = []", "xid_events = [79]", 1))
    config = site(shared, faulty)
    state, _out = job(shared, user)
    channel = FactChannel.open(state)
    assert channel is not None
    channel.write(fact("gpu.fault", 0, reason="xid gpu0: 79"))
    channel.close()
    assert epilog(config, user) == 0
    end = root_end(state)
    assert (end["kind"], end["exclude"]) == ("hardware", ["n1"])
    assert "confirmed by root's GPU check" in str(end["detail"])


def test_a_hang_counts_from_the_supervisors_channel_only(shared: Path,
                                                         user: UserIds) -> None:
    config = site(shared, FIXTURES / "healthy-4.toml")
    state, _out = job(shared, user)
    channel = FactChannel.open(state)
    assert channel is not None
    channel.write(fact("hang", 0, idle_s=60))
    channel.write(fact("hang", 5, idle_s=60))  # another attempt's: not this one's
    channel.close()
    info = os.lstat(state.path / "supervisor-facts.jsonl")
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o600)
    assert supervisor_facts(state, 0) == ("hang",)
    assert epilog(config, user, exit_code=0) == 0  # killed by the supervisor: the hang wins
    assert root_end(state)["kind"] == "hang"


def test_a_channel_anyone_else_could_write_is_ignored(shared: Path, user: UserIds) -> None:
    state = JobState(shared / "state", JOB)
    state.prepare(user.uid, user.gid)
    path = state.path / "supervisor-facts.jsonl"
    path.write_text(json.dumps(fact("hang", 0)) + "\n")
    os.chown(path, user.uid, user.gid)  # the user's file: a claim, not a fact
    assert supervisor_facts(state, 0) == ()
    with pytest.raises(Exception, match="not a regular root-owned file"):
        FactChannel.open(state)


def stage_out_job(shared: Path, user: UserIds, dest: str) -> tuple[object, ...]:
    config = site(shared, FIXTURES / "healthy-4.toml")
    cfg = parse(config.read_bytes(), str(config))
    state, out = job(shared, user)
    scratch = shared / "scratch" / JOB
    results = scratch / "results"
    results.mkdir()
    (results / "data.txt").write_text("precious\n")
    for path in (results, results / "data.txt"):
        os.chown(path, user.uid, user.gid)
    ctx = JobContext(hook="epilog", job_id=JOB, node="n1", user=user.name, uid=user.uid,
                     gid=user.gid)
    record = JobRecord(job_id=JOB, user=user.name, uid=user.uid, gid=user.gid, nodes=["n1"],
                       gpus=[], work_dir=str(shared), stdout=str(out), stderr=str(out),
                       options={"stage_out": [f"results:{dest}"]})
    return cfg, ctx, record, state, out


def test_an_unwritable_dest_keeps_the_results_and_says_where(shared: Path,
                                                            user: UserIds) -> None:
    locked = shared / "locked"
    locked.mkdir(mode=0o555)
    os.chown(locked, user.uid, user.gid)
    cfg, ctx, record, state, out = stage_out_job(shared, user, f"{locked}/out")
    problems = staging.stage_job_out(ctx, cfg, state, record,  # type: ignore[arg-type]
                                 deadline=time.monotonic() + 60)
    assert problems and "results:" in problems[0]
    staging.keep_results(ctx, cfg, state, record, problems)  # type: ignore[arg-type]
    kept = shared / "scratch" / ".quarantine" / JOB / "attempt0"
    assert (kept / "results" / "data.txt").read_text() == "precious\n"
    assert not (shared / "scratch" / JOB).exists()
    box = os.lstat(kept.parent)
    assert (box.st_uid, stat.S_IMODE(box.st_mode)) == (0, 0o711)
    info = os.lstat(kept)
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (user.uid, 0o700)
    told = out.read_text()
    assert "jobwrap: stage-out did not bring back all results of attempt 0" in told
    assert f"kept on node n1 in {kept}" in told and "until" in told
    [event] = [e for e in state.events() if e["event"] == "staging.kept"]
    assert event["source"] == "root" and event["path"] == str(kept)
    # a second attempt's results are kept beside the first's
    prepare_scratch(shared / "scratch", JOB, UserIds.of(user.uid, user.gid))
    staging.keep_results(ctx, cfg, state, record, ["again"])  # type: ignore[arg-type]
    assert (kept.parent / "attempt0.1").is_dir()


def test_kept_results_are_pruned_after_their_retention(shared: Path, user: UserIds) -> None:
    locked = shared / "locked"
    locked.mkdir(mode=0o555)
    os.chown(locked, user.uid, user.gid)
    cfg, ctx, record, state, _out = stage_out_job(shared, user, f"{locked}/out")
    staging.keep_results(ctx, cfg, state, record, ["x"])  # type: ignore[arg-type]
    box = shared / "scratch" / ".quarantine" / JOB
    staging.prune_kept(cfg)  # type: ignore[arg-type]
    assert box.is_dir()  # within its 7 days
    old = time.time() - 8 * 86400
    os.utime(box, (old, old))
    staging.prune_kept(cfg)  # type: ignore[arg-type]
    assert not box.exists()


def test_a_good_stage_out_removes_the_scratch(shared: Path, user: UserIds) -> None:
    mine = shared / "mine"
    mine.mkdir()
    os.chown(mine, user.uid, user.gid)
    cfg, ctx, record, state, _out = stage_out_job(shared, user, f"{mine}/back")
    assert staging.stage_job_out(ctx, cfg, state, record,  # type: ignore[arg-type]
                             deadline=time.monotonic() + 60) == []
    assert (mine / "back" / "data.txt").read_text() == "precious\n"


def test_the_slow_node_named_by_roots_judge_is_told_and_a_forged_one_is_not(
        shared: Path, user: UserIds) -> None:
    """The first node's judge keeps every node's score in root's pulse-speed.json and
    records pulse.slow; the epilog records pulse.speed and tells the job's output. What
    the job's user writes in its own file names no node slow."""
    from wrapper.job import events as ev
    from wrapper.job.paths import PULSE_SPEED_FILE
    from wrapper.job.store import JobStore

    config = site(shared, FIXTURES / "healthy-4.toml")
    state, out = job(shared, user)
    with open(state.path / USER_EVENTS, "a") as handle:
        handle.write(json.dumps({"ts": time.time(), "event": "pulse.slow", "attempt": 0,
                                 "node": "n1", "slow": "n1", "score": 0.1}) + "\n")
    assert epilog(config, user, exit_code=0) == 0
    assert "slow node" not in out.read_text()  # no file of root's: nothing to tell
    assert not [e for e in state.events() if e["event"] == "pulse.speed"]

    state.append("prolog.context", node="n1", hook="prolog", attempt=1, context={})
    state.write_json(PULSE_SPEED_FILE, {"attempt": 1, "scores": {"n1": 1.0, "n2": 0.97,
                                                                  "n3": 0.62},
                                        "named": ["n3"], "window_s": 60.0})
    state.append("pulse.slow", node="n1", attempt=1, slow="n3", score=0.64,
                 scores={"n1": 1.0, "n3": 0.64}, window_s=60.0, held_s=30.0)
    assert epilog(config, user, exit_code=0, attempt=1) == 0
    told = out.read_text()
    assert "jobwrap: slow node(s) in attempt 1: n3 at 0.64 of the job's typical rank's " \
        "speed when named" in told and "every node at the end: n1 1.00, n2 0.97, n3 0.62" \
        in told, told
    [speed] = [e for e in JobStore(state).root_events() if isinstance(e, ev.PulseSpeed)]
    assert (speed.attempt, speed.scores["n3"], speed.named) == (1, 0.62, ["n3"])
