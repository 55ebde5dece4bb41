from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.archive import record, run_attempt
from wrapper.archive.manifest import SCHEMA_VERSION, build, merge_events, read_code
from wrapper.job import events as ev
from wrapper.job.state import JobState
from wrapper.osl.child import call_as as as_user
from wrapper.osl.users import UserIds


def git(user: UserIds, repo: Path, *args: str) -> None:
    def run() -> int:
        env = {"HOME": str(repo), "PATH": os.environ["PATH"], "GIT_AUTHOR_NAME": "t",
               "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}
        return subprocess.run(["git", "-C", str(repo), *args], env=env, check=True,
                              capture_output=True).returncode
    assert as_user(user, run) == 0


def test_git_facts_are_read_as_the_user(work: Path, user: UserIds) -> None:
    assert read_code(user, str(work), 10)["repository"] is False
    git(user, work, "init", "-q")
    empty = read_code(user, str(work), 10)
    assert (empty["repository"], empty["commit"], empty["error"]) == (True, None, "")
    (work / "train.py").write_text("print(1)\n")
    os.chown(work / "train.py", user.uid, user.gid)
    git(user, work, "add", "train.py")
    git(user, work, "commit", "-q", "-m", "first")
    clean = read_code(user, str(work), 10)
    assert len(clean["commit"]) == 40 and clean["dirty"] is False and clean["changes"] == 0
    (work / "train.py").write_text("print(2)\n")
    dirty = read_code(user, str(work), 10)
    assert dirty["commit"] == clean["commit"]
    assert (dirty["dirty"], dirty["changes"]) == (True, 1)
    assert not (work / ".git" / "index.lock").exists()


def test_a_work_dir_the_user_cannot_read_is_an_error_not_a_crash(shared: Path,
                                                                 user: UserIds) -> None:
    private = shared / "private"
    private.mkdir(mode=0o700)
    facts = read_code(user, str(private), 10)
    assert facts["repository"] is False and facts["error"]
    assert read_code(user, "", 10)["error"] == "the job's work dir is not known"


def test_the_manifest_tells_what_the_cluster_did(shared: Path, user: UserIds,
                                                 job: JobState) -> None:
    run_attempt(job, 0, ["n1", "n2"], kind="hardware", decision="requeue", checkpoints=(100,))
    run_attempt(job, 1, ["n1", "n3"], checkpoints=(200, 300))
    files = [{"name": "stdout.gz", "kind": "stdout", "status": "archived"}]
    parts = [
        {"attempt": 0, "node": "n1", "complete": True, "files": files,
         "extra": {"slurm": {"JobName": "train", "Account": "proj",
                             "SubmitTime": "2024-05-01T10:00:00", "TimeLimit": "01:00:00"},
                   "software": {"driver": "550.54.15"}, "staging": {"files": 3}},
         "gpus": [{"index": 0, "uuid": "GPU-a", "serial": "1"}],
         "code": {"commit": "abc", "dirty": False}, "events": []},
        {"attempt": 0, "node": "n2", "complete": True, "files": files, "extra": {}},
        {"attempt": 1, "node": "n1", "complete": True, "files": files,
         "extra": {"software": {"driver": "550.90.07"}}, "code": {"commit": "def"}},
    ]
    manifest = build(record=record(shared, user), parts=parts, events=job.events(),
                     config_digest="d1g", config_source="/etc/jobwrap/config.toml", now=5.0)
    assert manifest["schema_version"] == SCHEMA_VERSION and manifest["updated_at"] == 5.0
    info = manifest["job"]
    assert (info["id"], info["name"], info["account"], info["partition"]) == (
        "42", "train", "proj", "gpu")
    assert info["gpus"] == {"n1": [{"index": 0, "uuid": "GPU-a", "serial": "1"}]}
    assert info["limits"]["time_limit_s"] == 3600.0 and info["submit_time"] is not None
    assert info["end_time"] is not None  # the job is over: success, done
    first, second = manifest["attempts"]
    assert (first["nodes"], first["outcome"], first["decision"]) == (
        ["n1", "n2"], "hardware", "requeue")
    assert sorted(first["files"]) == ["n1", "n2"] and first["staging"] == {"n1": {"files": 3}}
    assert (second["checkpoints"], second["latest_step"]) == (2, 300)
    assert manifest["software"] == {"n1": {"driver": "550.90.07"}}  # the latest attempt's
    assert manifest["code"] == {"commit": "def"}
    assert manifest["jobwrap"]["config_digest"] == "d1g"
    assert manifest["exit"] == {"attempt": 1, "status": "ended", "outcome": "success",
                                "exit_code": 0, "exit_signal": 0, "slurm_state": "",
                                "decision": "done", "final": True}
    # attempt 1 ran its epilog on n3 too, and n3 has no part yet
    assert manifest["archive"]["missing"] == [{"attempt": 1, "node": "n3"}]
    assert manifest["archive"]["complete"] is False


def test_events_seen_by_two_nodes_count_once() -> None:
    event = {"ts": 1.5, "event": "epilog.context", "node": "n1", "attempt": 0,
             "source": "root"}
    later = {**event, "ts": 2.5, "node": "n2"}
    merged = merge_events([later, event, dict(event)])
    assert [(type(e), e.node, e.ts) for e in merged] == [(ev.EpilogContext, "n1", 1.5),
                                                         (ev.EpilogContext, "n2", 2.5)]
