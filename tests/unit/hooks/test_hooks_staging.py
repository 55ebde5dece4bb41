"""The hooks' staging glue on real files, as root with the real test user."""

from __future__ import annotations

import os
import time
from pathlib import Path

from wrapper.config import parse
from wrapper.hooks import staging
from wrapper.job.record import JobRecord
from wrapper.job.state import JobState
from wrapper.osl.users import UserIds
from wrapper.slurm.context import JobContext


def setup(shared: Path, user: UserIds, cache_mode: int) -> tuple[object, ...]:
    data = shared / "data"
    data.mkdir()
    (data / "a.txt").write_text("hello\n")
    for path in (data, data / "a.txt"):
        os.chown(path, user.uid, user.gid)
    for sub in ("scratch", "state"):
        (shared / sub).mkdir(mode=0o755)
    (shared / "cache").mkdir()
    os.chmod(shared / "cache", cache_mode)
    cfg = parse(f'[paths]\nstate_dir = "{shared}/state"\nscratch_root = "{shared}/scratch"\n'
                f'cache_root = "{shared}/cache"\n[log]\nfile = ""\n'.encode(), "test.toml")
    ctx = JobContext(hook="prolog", job_id="7", node="n1", user=user.name, uid=user.uid,
                     gid=user.gid)
    record = JobRecord(job_id="7", user=user.name, uid=user.uid, gid=user.gid, nodes=["n1"],
                       gpus=[], work_dir=str(shared),
                       options={"stage_in": [f"{data}:data"]})
    state = JobState(shared / "state", "7")
    state.prepare(user.uid, user.gid)
    return cfg, ctx, record, state


def events(state: JobState) -> list[str]:
    return [e["event"] for e in state.events()]


def test_stage_in_through_the_cache(shared: Path, user: UserIds) -> None:
    cfg, ctx, record, state = setup(shared, user, 0o700)
    staging.stage_job_in(ctx, cfg, state, record, deadline=time.monotonic() + 60)  # type: ignore[arg-type]
    assert (shared / "scratch" / "7" / "data" / "a.txt").read_text() == "hello\n"
    assert "staging.in" in events(state) and "staging.cache_unusable" not in events(state)


def test_an_unusable_cache_is_bypassed_not_blamed_on_the_job(shared: Path,
                                                             user: UserIds) -> None:
    cfg, ctx, record, state = setup(shared, user, 0o755)  # unsafe: others may read it
    staging.stage_job_in(ctx, cfg, state, record, deadline=time.monotonic() + 60)  # type: ignore[arg-type]
    assert (shared / "scratch" / "7" / "data" / "a.txt").read_text() == "hello\n"
    names = events(state)
    assert "staging.cache_unusable" in names and "staging.in" in names
    assert "staging.failed" not in names
    [bypassed] = [e for e in state.events() if e["event"] == "staging.cache_unusable"]
    assert "must be owned by uid 0 with mode 0700" in bypassed["error"]
