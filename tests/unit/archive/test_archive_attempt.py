from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.archive import config, record, run_attempt, user_file
from wrapper.archive import archive_attempt
from wrapper.archive.attempt import output_specs
from wrapper.archive.store import list_archives, load_manifest
from wrapper.config import Config
from wrapper.job.state import JobState
from wrapper.osl.users import UserIds

SCRIPT = "#!/bin/bash\n#SBATCH --output=job-%j.out\nsrun python train.py\n"


def manifest(base: Path, user: UserIds, job_id: str = "42") -> dict[str, Any]:
    data: dict[str, Any] = json.loads((base / "archive" / user.name / job_id /
                                       "manifest.json").read_text())
    return data


def test_a_requeued_two_node_job_ends_up_in_one_archive(shared: Path, user: UserIds,
                                                        job: JobState, work: Path) -> None:
    cfg = config(shared, outputs=("rank-%N.log",))
    out = user_file(work / "job-42.out", user, "attempt 0 output\n")
    for node in ("n1", "n2"):
        user_file(work / f"rank-{node}.log", user, f"rank log of {node}\n")
    run_attempt(job, 0, ["n1", "n2"], kind="hardware", decision="requeue", checkpoints=(10,))
    rec = record(shared, user)
    extra = {"slurm": {"JobName": "train"}, "software": {"driver": "550"}}
    for node in ("n2", "n1"):  # the nodes' epilogs finish in any order
        result = archive_attempt(cfg, job, rec, attempt=0, node=node,
                                 script_text=SCRIPT if node == "n1" else "", extra=extra)
        assert result.complete and result.problems == []
    out.write_text("attempt 0 output\nattempt 1 output\n")
    run_attempt(job, 1, ["n1", "n2"], checkpoints=(20, 30))
    for node in ("n1", "n2"):
        archive_attempt(cfg, job, rec, attempt=1, node=node, script_text="", extra=extra)
    folder = shared / "archive" / user.name / "42"
    names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.gz"))
    assert "attempt-0/n1/stdout.gz" in names and "attempt-1/n1/stdout.gz" in names
    assert "attempt-0/n2/output-rank-n2.log.gz" in names  # patterns expanded per node
    assert "attempt-0/n1/output-rank-n1.log.gz" in names
    assert not any(n.startswith("attempt-0/n2/stdout") for n in names)  # the batch host's
    assert gzip.decompress((folder / "attempt-1/n1/stdout.gz").read_bytes()).endswith(
        b"attempt 1 output\n")
    data = manifest(shared, user)
    assert [a["attempt"] for a in data["attempts"]] == [0, 1]
    assert [a["decision"] for a in data["attempts"]] == ["requeue", "done"]
    assert data["attempts"][1]["latest_step"] == 30
    assert data["archive"]["complete"] is True and data["archive"]["missing"] == []
    assert data["job"]["name"] == "train" and data["exit"]["final"] is True
    assert data["jobwrap"]["config_digest"] == cfg.digest()
    assert [i.job_id for i in list_archives(cfg.paths.archive_root)] == ["42"]


def test_a_users_bad_output_is_recorded_never_raised(shared: Path, user: UserIds,
                                                     cfg: Config, job: JobState,
                                                     work: Path) -> None:
    secret = shared / "secret"
    secret.write_text("root only\n")
    os.chmod(secret, 0o600)
    rec = record(shared, user, stdout=str(work / "job.out"), stderr=str(work / "job.err"))
    (work / "job.err").symlink_to(secret)
    run_attempt(job, 0, ["n1"], kind="user_error", decision="stop")
    result = archive_attempt(cfg, job, rec, attempt=0, node="n1", script_text=SCRIPT, extra={})
    assert result.complete  # what could be archived is; nothing failed on our side
    assert any("stdout" in p and "missing" in p for p in result.problems)
    assert any("stderr" in p and "refused" in p for p in result.problems)
    stored = shared / "archive" / user.name / "42" / "attempt-0" / "n1"
    assert not (stored / "stderr.gz").exists()
    files = {f["kind"]: f for f in manifest(shared, user)["attempts"][0]["files"]["n1"]}
    assert files["stderr"]["status"] == "refused"


def test_an_epilog_killed_mid_archive_is_finished_by_the_next(
        shared: Path, user: UserIds, cfg: Config, job: JobState, work: Path) -> None:
    user_file(work / "job-42.out", user, "out\n")
    rec = record(shared, user, nodes=["n1"])
    run_attempt(job, 0, ["n1"], kind="hang", decision="requeue")
    pid = os.fork()
    if pid == 0:
        try:
            from wrapper.archive import store

            def killed(self: store.Writer, build: Any) -> str:
                os.kill(os.getpid(), 9)
                return ""

            store.Writer.commit = killed  # type: ignore[method-assign]
            archive_attempt(cfg, job, rec, attempt=0, node="n1", script_text=SCRIPT, extra={})
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status)
    assert list_archives(cfg.paths.archive_root) == []  # nothing looks complete
    run_attempt(job, 1, ["n1"])
    result = archive_attempt(cfg, job, rec, attempt=1, node="n1", script_text=SCRIPT, extra={})
    assert result.recovered == [0]
    data = manifest(shared, user)
    assert [(p["attempt"], p["recovered_by"]) for p in data["archive"]["parts"]] == [
        (0, 1), (1, None)]
    assert data["archive"]["complete"] is True
    leftovers = [p for p in (shared / "archive" / user.name).iterdir() if p.suffix == ".tmp"]
    assert leftovers == []


def test_a_spent_budget_leaves_an_archive_marked_incomplete(
        shared: Path, user: UserIds, job: JobState, work: Path) -> None:
    cfg = config(shared, budget=0.001)
    user_file(work / "job-42.out", user, "out\n")
    run_attempt(job, 0, ["n1"])
    ticks = iter([0.0, 100.0])

    def clock() -> float:
        return next(ticks, 100.0)

    result = archive_attempt(cfg, job, record(shared, user, nodes=["n1"]), attempt=0,
                             node="n1", script_text=SCRIPT, extra={}, clock=clock)
    assert result.complete is False
    assert any("skipped" in p for p in result.problems)
    assert load_manifest(cfg.paths.archive_root, "42")["archive"]["complete"] is False


def test_a_broken_archive_root_is_reported_not_raised(shared: Path, user: UserIds,
                                                      cfg: Config, job: JobState,
                                                      root: Path) -> None:
    root.write_text("a file where the root should be\n")
    result = archive_attempt(cfg, job, record(shared, user), attempt=0, node="n1",
                             script_text="", extra={})
    assert result.complete is False and result.path == ""
    assert result.problems and "could not be written" in result.problems[0]


def test_archiving_off_does_nothing(shared: Path, user: UserIds, job: JobState,
                                   root: Path) -> None:
    cfg = config(shared, enabled=False)
    result = archive_attempt(cfg, job, record(shared, user), attempt=0, node="n1",
                             script_text="", extra={})
    assert result.complete is False and not root.exists()


@pytest.mark.parametrize(("stdout", "slurm", "expected"), [
    ("", {}, "/w/slurm-42.out"),
    ("", {"ArrayJobId": "40", "ArrayTaskId": "2"}, "/w/slurm-40_2.out"),
    ("/w/out-%N-%x.txt", {"JobName": "train"}, "/w/out-n1-train.txt"),
    ("rel/%j.out", {}, "/w/rel/42.out"),
])
def test_where_the_batch_output_is_looked_for(shared: Path, user: UserIds, stdout: str,
                                              slurm: dict[str, str], expected: str) -> None:
    rec = record(shared, user, stdout=stdout, work_dir="/w")
    specs = output_specs(rec, slurm, "n1", [])
    assert specs[0].kind == "stdout" and specs[0].candidates[0] == expected
    assert output_specs(rec, slurm, "n2", []) == ()  # only the batch host has it


def test_a_flood_of_user_events_pushes_none_of_roots_out_of_the_part() -> None:
    from wrapper.archive.attempt import MAX_PART_EVENTS, _of_attempt

    root = [{"event": "prolog.context", "attempt": 1, "source": "root"},
            {"event": "attempt.end", "attempt": 1, "source": "root"}]
    flood = [{"event": "checkpoint", "attempt": 1, "source": "user", "ts": 1e12}
             for _ in range(MAX_PART_EVENTS + 10)]
    kept = _of_attempt([root[0], *flood, root[1]], 1)
    assert len(kept) == MAX_PART_EVENTS and kept[0] is root[0] and kept[-1] is root[1]
