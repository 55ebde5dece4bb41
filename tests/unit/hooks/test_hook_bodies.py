"""The prolog and task-prolog bodies driven with fakes, like the epilog's decision matrix.

Slurm is the in-process ``FakeSlurm`` (the job's record and batch script), the GPUs are
the ``fake`` probe through ``Services.probe_factory`` (the seam NVML uses), the release
spawner records its argv. The state folder, the checks and the record are real. What is
checked is what root recorded and did, and what the task-prolog tells Slurm.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from wrapper.config import ChecksConfig, Config, PathsConfig, SupervisorConfig
from wrapper.errors import EXIT_OK, EXIT_UNHEALTHY
from wrapper.gpu.fake import FakeProbe, parse_inventory
from wrapper.hooks import Services, prolog, task_prolog
from wrapper.job import events as ev
from wrapper.job import record as jobrecord
from wrapper.job.state import JobState
from wrapper.job.store import JobStore
from wrapper.slurm.context import JobContext
from wrapper.slurm.fake import FakeSlurm

HEALTHY = Path(__file__).resolve().parents[2] / "fixtures" / "gpu" / "healthy-4.toml"
JOB = "63"


def script(directives: str) -> str:
    return f"#!/bin/bash\n#SBATCH --output=out\n{directives}\npython3 train.py\n"


def setting(tmp_path: Path, *, directives: str = "", inventory: bytes | None = None
            ) -> tuple[Config, FakeSlurm, Services, list[Sequence[str]], list[str]]:
    cfg = Config(paths=PathsConfig(state_dir=str(tmp_path / "state"),
                                   scratch_root=str(tmp_path / "scratch"),
                                   archive_root=str(tmp_path / "archive")),
                 checks=ChecksConfig(prolog=True, epilog=False),
                 supervisor=SupervisorConfig(enabled=False))
    (tmp_path / "scratch").mkdir()
    slurm = FakeSlurm(jobs={JOB: {"JobId": JOB, "JobState": "RUNNING",
                                  "WorkDir": str(tmp_path), "StdOut": str(tmp_path / "out"),
                                  "StdErr": str(tmp_path / "out"), "Requeue": "1"}},
                      scripts={JOB: script(directives)},
                      nodes={"n1": {"NodeName": "n1", "Gres": "gpu:4"}})
    raw = HEALTHY.read_bytes() if inventory is None else inventory
    opened: list[str] = []

    def probe(node: str) -> FakeProbe:
        opened.append(node)
        return FakeProbe(parse_inventory(raw, f"<{node}>"), f"<{node}>")

    spawned: list[Sequence[str]] = []
    services = Services(cfg, slurm_factory=lambda: slurm, probe_factory=probe,
                        spawn=spawned.append)
    return cfg, slurm, services, spawned, opened


def ctx_of(hook: str, attempt: int = 0) -> JobContext:
    return JobContext(hook=hook, job_id=JOB, user="u", uid=os.getuid(), gid=os.getgid(),
                      node="n1", nodes=["n1"], gpus=[0, 1], attempt=attempt)


def kinds(cfg: Config) -> list[str]:
    return [e.KIND for e in JobStore.of(cfg, JOB).root_events()]


def test_a_healthy_prolog_records_the_job_once_and_checks_through_the_probe_seam(
        tmp_path: Path) -> None:
    cfg, slurm, services, spawned, opened = setting(tmp_path)
    assert prolog.run(ctx_of("prolog"), cfg, io.StringIO(), {}, services) == EXIT_OK
    assert opened == ["n1"]
    assert kinds(cfg)[:2] == ["prolog.context", "health"]
    store = JobStore.of(cfg, JOB)
    [health] = [e for e in store.root_events() if isinstance(e, ev.Health)]
    assert health.verdict == "pass" and health.phase == "prolog"
    assert store.script() == script("")  # kept: the epilog's archive asks Slurm no more
    assert [c for c in slurm.calls if c[0] in ("requeue", "drain")] == []
    # only this node's root fault feed, for this job, its node and its GPUs; the job's
    # nodes, the first first, for its pulse
    [watcher] = spawned
    assert list(watcher[watcher.index("wrapper.watch"):]) == [
        "wrapper.watch", JOB, "--node", "n1", "--attempt", "0", "--gpus", "0,1",
        "--uid", str(os.getuid()), "--gid", str(os.getgid()), "--nodes", "n1"]
    assert jobrecord.load(store.state).stdout == str(tmp_path / "out")


def test_an_unhealthy_gpu_fails_the_prolog_and_releases_the_job_away_from_the_node(
        tmp_path: Path) -> None:
    sick = HEALTHY.read_bytes().replace(b"ecc_volatile_uncorrected = 0",
                                        b"ecc_volatile_uncorrected = 3", 1)
    cfg, _, services, spawned, _ = setting(tmp_path, inventory=sick)
    assert prolog.run(ctx_of("prolog", 1), cfg, io.StringIO(), {}, services) == EXIT_UNHEALTHY
    [bad] = [e for e in JobStore.of(cfg, JOB).root_events()
             if isinstance(e, ev.PrologUnhealthy)]
    assert bad.reason and bad.reason.startswith("jobwrap:") and "gpu0" in bad.reason
    [argv] = spawned
    assert list(argv[argv.index("release"):]) == ["release", JOB, "--exclude", "n1",
                                                  "--running-grace", "30"]


def test_bad_directives_are_the_users_and_the_task_prolog_refuses_the_job(
        tmp_path: Path) -> None:
    cfg, _, services, spawned, _ = setting(tmp_path, directives="#JOBWRAP --max-restarts=x")
    assert prolog.run(ctx_of("prolog"), cfg, io.StringIO(), {}, services) == EXIT_OK
    [invalid] = [e for e in JobStore.of(cfg, JOB).root_events()
                 if isinstance(e, ev.DirectivesInvalid)]
    assert "max-restarts" in invalid.error
    assert [argv for argv in spawned if "wrapper.watch" not in argv] == []  # no release
    out = io.StringIO()
    code = task_prolog.run(ctx_of("task-prolog"), cfg, out,
                           {"SLURM_STEP_ID": "batch", "SLURM_PROCID": "0"}, Services(cfg))
    said = out.getvalue()
    assert code == 1
    assert "export JOBWRAP_ATTEMPT=0\n" in said  # the variables come first, whatever follows
    assert "print jobwrap: the job did not start:" in said and "max-restarts" in said


@pytest.mark.parametrize("attempt", [0, 2])
def test_the_task_prolog_exports_roots_resume_pick_and_says_why(tmp_path: Path,
                                                                attempt: int) -> None:
    ckpts = tmp_path / "ck"
    ckpts.mkdir()
    for step in (1, 2):
        (ckpts / f"model_{step}.pt").write_bytes(b"w")
        os.utime(ckpts / f"model_{step}.pt", (1000.0 + step, 1000.0 + step))
    cfg, _, services, _, _ = setting(
        tmp_path, directives=f"#JOBWRAP --checkpoint-dir={ckpts} --checkpoint-glob=model_*.pt")
    assert prolog.run(ctx_of("prolog", attempt), cfg, io.StringIO(), {}, services) == EXIT_OK
    store = JobStore.of(cfg, JOB)
    chosen = store.resumed_from(attempt)
    # Root picks (and records) only for a requeued attempt: attempt 0 starts fresh.
    assert (chosen.path if chosen else None) == (f"{ckpts}/model_2.pt" if attempt else None)
    if attempt:
        store.record(ev.AttemptEnd(attempt=attempt - 1, node="n1", kind="walltime",
                                   detail="reached its time limit", decision="requeue"))
    out = io.StringIO()
    env = {"SLURM_STEP_ID": "batch", "SLURM_PROCID": "0"}
    assert task_prolog.run(ctx_of("task-prolog", attempt), cfg, out, env,
                           Services(cfg)) == EXIT_OK
    said = out.getvalue()
    assert f"export JOBWRAP_ATTEMPT={attempt}\n" in said
    assert f"export JOBWRAP_CHECKPOINT_DIR={ckpts}\n" in said
    assert f"export JOBWRAP_SCRATCH={tmp_path}/scratch/{JOB}\n" in said
    assert ("JOBWRAP_RESUME_FROM" in said) == bool(attempt)
    if attempt:
        assert f"print jobwrap: attempt {attempt} after walltime (reached its time limit); " \
               f"resuming from {ckpts}/model_2.pt\n" in said
    claims = [e for e in store.events() if isinstance(e, ev.TaskPrologContext)]
    assert len(claims) == 1 and claims[0].source == "user"
    # A step of a command under jobwrap run keeps what jobwrap run chose between runs
    # (a checkpoint seconds old is not settled for the task-prolog, and would be passed
    # over); the job's other variables still come from here.
    out = io.StringIO()
    assert task_prolog.run(ctx_of("task-prolog", attempt), cfg, out,
                           {"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "JOBWRAP_RUN": "1"},
                           Services(cfg)) == EXIT_OK
    said = out.getvalue()
    assert "JOBWRAP_RESUME_FROM" not in said and "JOBWRAP_ATTEMPT" not in said
    assert f"export JOBWRAP_CHECKPOINT_DIR={ckpts}\n" in said
    # ... of its own job: a job submitted from inside one inherits JOBWRAP_RUN (sbatch
    # exports the environment), under the other job's id, and gets its own exports
    out = io.StringIO()
    assert task_prolog.run(ctx_of("task-prolog", attempt), cfg, out,
                           {"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "JOBWRAP_RUN": "99",
                            "SLURM_JOB_ID": JOB}, Services(cfg)) == EXIT_OK
    assert f"export JOBWRAP_ATTEMPT={attempt}\n" in out.getvalue()


def test_the_task_prolog_survives_a_missing_record(tmp_path: Path) -> None:
    cfg = Config(paths=PathsConfig(state_dir=str(tmp_path / "state"),
                                   scratch_root=str(tmp_path / "scratch")))
    state = JobState(tmp_path / "state", JOB)
    state.prepare(os.getuid(), os.getgid())
    # The prolog ran (its first record) but wrote no job record: the job still starts.
    JobStore(state).record(ev.PrologContext(node="n1", hook="prolog", attempt=1))
    out = io.StringIO()
    assert task_prolog.run(ctx_of("task-prolog", 1), cfg, out, {"SLURM_STEP_ID": "0"},
                           Services(cfg)) == EXIT_OK
    assert out.getvalue().startswith("export JOBWRAP_ATTEMPT=1\n")
