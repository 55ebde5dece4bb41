"""jobwrap upgraded under a running job: the state-format rule (docs/upgrades.md).

Files an older jobwrap wrote (no format field: format 1) are read; a file a newer one
wrote is refused with one message that names it, its format and the one this jobwrap
reads, and a hook that meets it neither raises nor drains; a kind of event this version
does not know is skipped. The last tests run the previous commit's own code (``git
archive`` of it) for the first attempts of a job and this code for the rest.
"""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.support.epilog import JobFiles
from tests.support.hooks import FIXTURES, slurm_env
from tests.support.staging import SETTINGS, Jobs, MakeDataset
from wrapper.archive import index as index_mod
from wrapper.archive import spool as spool_mod
from wrapper.archive import store as archive_store
from wrapper.cli import cli
from wrapper.errors import FormatTooNew, format_of
from wrapper.hooks import Services, run_hook
from wrapper.hooks.epilog import decide_attempt
from wrapper.job import events as ev
from wrapper.job import record as jobrecord
from wrapper.job.facts import supervisor_facts
from wrapper.job.paths import SUPERVISOR_FACTS
from wrapper.job.state import EVENTS_FORMAT, JobState
from wrapper.job.store import JobStore
from wrapper.slurm.context import JobContext
from wrapper.slurm.fake import FakeSlurm

REPO = Path(__file__).resolve().parents[3]
# The last commit before jobwrap's files carried format numbers: its state is what every
# site that upgrades has on disk (docs/upgrades.md).
PREVIOUS = "0c9b04f"


def _append_raw(path: Path, record: dict[str, object]) -> None:
    with path.open("a") as handle:
        handle.write(json.dumps(record) + "\n")


# -- the rule itself ------------------------------------------------------------------------
def test_absent_is_format_1_and_newer_is_refused_with_what_to_do(tmp_path: Path) -> None:
    where = tmp_path / "job.json"
    assert format_of({}, "format", known=1, path=where, what="job record") == 1
    assert format_of({"format": 2}, "format", known=3, path=where, what="job record") == 2
    with pytest.raises(FormatTooNew) as caught:
        format_of({"format": 4}, "format", known=3, path=where, what="job record")
    message = str(caught.value)
    assert message.startswith(f"{where} is in job record format 4, written by a newer "
                              "jobwrap; this jobwrap (")
    assert "reads job record formats 1 to 3" in message
    assert "install the same jobwrap on every node" in message
    assert "\n" not in message
    for bad in ("2", 0, True, None):  # no jobwrap writes these: refused too, not guessed
        with pytest.raises(FormatTooNew, match="which no jobwrap writes"):
            format_of({"format": bad}, "format", known=3, path=where, what="job record")


# -- the job's events -----------------------------------------------------------------------
def test_event_lines_without_a_version_are_read(tmp_path: Path, job_files: JobFiles) -> None:
    """Every line written before formats were numbered (all of them, so far) is format 1."""
    _, state, _ = job_files(tmp_path, "51", "", {})
    _append_raw(state.path / "events.jsonl", {"ts": 1.0, "event": "prolog.context",
                                              "attempt": 0, "node": "n1", "hook": "prolog"})
    _append_raw(state.path / "events.jsonl", {"ts": 2.0, "event": "prolog.context",
                                              "attempt": 1, "node": "n1", "hook": "prolog",
                                              "v": EVENTS_FORMAT})
    assert JobStore(state).current_attempt() == 1


def test_a_newer_line_in_roots_events_is_refused_by_name(tmp_path: Path,
                                                         job_files: JobFiles) -> None:
    _, state, _ = job_files(tmp_path, "52", "", {})
    state.append("prolog.context", node="n1", hook="prolog", attempt=0)
    _append_raw(state.path / "events.jsonl", {"ts": time.time(), "event": "attempt.end",
                                              "v": EVENTS_FORMAT + 1, "attempt": 0})
    with pytest.raises(FormatTooNew) as caught:
        JobStore(state).root_events()
    assert str(state.path / "events.jsonl") in str(caught.value)
    assert f"event line format {EVENTS_FORMAT + 1}" in str(caught.value)


def test_a_newer_line_in_the_users_events_is_skipped(tmp_path: Path,
                                                     job_files: JobFiles) -> None:
    """The job's user writes what they like there: a number cannot stop root's reader."""
    _, state, _ = job_files(tmp_path, "53", "", {})
    state.append("prolog.context", node="n1", hook="prolog", attempt=0)
    _append_raw(state.path / "user-events.jsonl", {"ts": time.time(), "event": "hang",
                                                   "v": 99, "attempt": 0})
    state.append("checkpoint", as_user=True, attempt=0, path="/c/1", step=1)
    kinds = [e.KIND for e in JobStore(state).events()]
    assert kinds == ["prolog.context", "checkpoint"]


def test_a_newer_line_in_the_supervisors_facts_is_refused(tmp_path: Path,
                                                          job_files: JobFiles) -> None:
    _, state, _ = job_files(tmp_path, "54", "", {})
    facts = state.path / SUPERVISOR_FACTS
    _append_raw(facts, {"event": "hang", "attempt": 0})
    facts.chmod(0o600)
    assert supervisor_facts(state, 0) == ("hang",)
    _append_raw(facts, {"event": "hang", "attempt": 0, "v": EVENTS_FORMAT + 1})
    with pytest.raises(FormatTooNew, match="event line format"):
        supervisor_facts(state, 0)


def test_a_kind_this_version_does_not_know_is_skipped_by_the_epilog(
        tmp_path: Path, job_files: JobFiles) -> None:
    """A newer jobwrap adds a kind within the same format: this one reads it as Unknown,
    decides from the rest, and shows the rest."""
    cfg, state, record = job_files(tmp_path, "55", "step 1\nValueError: bad input\n",
                                   {"max_restarts": 3})
    store = JobStore(state)
    store.record(ev.PrologContext(node="n1", hook="prolog", attempt=0))
    state.append("future.kind", attempt=0, node="n1", anything={"nested": [1, 2]})
    state.append("future.claim", as_user=True, attempt=0, words="from a newer supervisor")
    events = store.events()
    unknown = [e for e in events if isinstance(e, ev.Unknown)]
    assert sorted(e.name for e in unknown) == ["future.claim", "future.kind"]
    slurm = FakeSlurm(jobs={"55": {"JobId": "55", "JobState": "FAILED", "Requeue": "1"}})
    ctx = JobContext(hook="epilog", job_id="55", user="u", uid=os.getuid(), gid=os.getgid(),
                     node="n1", nodes=["n1"], gpus=[0], attempt=0, exit_code=1,
                     exit_signal=0)
    decision, _ = decide_attempt(ctx, cfg, state, record, slurm, gpu_check_failed=False,
                                 services=Services(cfg, spawn=lambda argv: None,
                                                   gpu_confirm=lambda n, g: []))
    assert decision.action == "requeue"
    [end] = [e for e in store.root_events() if isinstance(e, ev.AttemptEnd)]
    assert end.kind == "user_error"


# -- the job's record ------------------------------------------------------------------------
def test_the_job_record_without_a_format_is_read_and_a_newer_one_refused(
        tmp_path: Path, job_files: JobFiles) -> None:
    _, state, record = job_files(tmp_path, "56", "", {})  # written as before: no format
    assert "format" not in json.loads((state.path / jobrecord.RECORD).read_text())
    assert jobrecord.load(state) == record
    state.write_json(jobrecord.RECORD, record.stored())
    assert json.loads((state.path / jobrecord.RECORD).read_text())["format"] == \
        jobrecord.RECORD_FORMAT
    assert jobrecord.load(state) == record
    state.write_json(jobrecord.RECORD, {**record.stored(), "format": 2, "new_field": 1})
    with pytest.raises(FormatTooNew, match="job record format 2"):
        jobrecord.load(state)


# -- an epilog over a newer jobwrap's job -----------------------------------------------------
def _site(tmp_path: Path) -> tuple[Path, Path]:
    """A site that drains on jobwrap's own failures, with an scontrol that records any
    call: a FormatTooNew must not reach it."""
    calls = tmp_path / "scontrol-calls"
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexit 1\n')
    scontrol.chmod(0o755)
    config = tmp_path / "jobwrap.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path}/state"\n'
                      f'scratch_root = "{tmp_path}/scratch"\n'
                      f'archive_root = "{tmp_path}/archive"\n'
                      f'[log]\nfile = "{tmp_path}/jobwrap.log"\n'
                      f'[slurm]\nscontrol_command = "{scontrol}"\n'
                      f'[hooks]\non_internal_error = "drain"\n'
                      f'[gpu]\nbackend = "fake"\nfake_inventory = "{FIXTURES}/healthy-4.toml"\n')
    return config, calls


def test_an_epilog_over_a_newer_jobs_state_says_so_and_never_drains(tmp_path: Path) -> None:
    config, calls = _site(tmp_path)
    env = slurm_env("epilog", SLURM_JOB_EXIT_CODE2="1:0")
    state = JobState(tmp_path / "state", "31")
    state.prepare(0, 0)
    state.append("prolog.context", node="n1", hook="prolog", attempt=1)
    _append_raw(state.path / "events.jsonl", {"ts": time.time(), "event": "health",
                                              "v": EVENTS_FORMAT + 1, "attempt": 1})
    slurm = FakeSlurm(jobs={"31": {"JobId": "31", "JobState": "FAILED", "Requeue": "1"}})
    from wrapper import config as config_mod

    services = Services(config_mod.load(str(config), env), slurm_factory=lambda: slurm,
                        spawn=lambda argv: None)
    assert run_hook("epilog", config_path=str(config), env=env, out=io.StringIO(),
                    services=services) == 0
    assert not calls.exists()  # no drain (nor anything else) through scontrol
    assert [c for c in slurm.calls if c[0] in ("drain_node", "requeue")] == []
    lines = [json.loads(line) for line in (tmp_path / "jobwrap.log").read_text().splitlines()]
    [refused] = [line for line in lines if line["event"] == "hook.format_too_new"]
    assert refused["level"] == "error" and refused["path"] == str(state.path / "events.jsonl")
    assert "Finish the upgrade" in refused["error"]
    assert not any(line["event"] in ("hook.bug", "hook.failed") for line in lines)
    assert "Traceback" not in (tmp_path / "jobwrap.log").read_text()
    # By hand (not under Slurm) the same is exit 2, jobwrap's own trouble, with the message.
    bare = {k: v for k, v in env.items() if k != "SLURM_SCRIPT_CONTEXT"}
    assert run_hook("epilog", config_path=str(config), env=bare, out=io.StringIO(),
                    services=services) == 2


def test_status_over_a_newer_jobs_state_is_one_line(tmp_path: Path) -> None:
    config, _ = _site(tmp_path)
    state = JobState(tmp_path / "state", "31")
    state.prepare(0, 0)
    _append_raw(state.path / "events.jsonl", {"ts": time.time(), "event": "prolog.context",
                                              "v": EVENTS_FORMAT + 1, "attempt": 0})
    result = CliRunner().invoke(cli, ["--config", str(config), "status", "31"])
    assert result.exit_code == 2
    assert "event line format 2" in result.stderr and "Traceback" not in result.output


# -- node caches: a newer one is a miss --------------------------------------------------------
def test_a_newer_node_cache_is_asked_again(tmp_path: Path) -> None:
    from wrapper.config import Config, PathsConfig
    from wrapper.hooks.health import configured_gres
    from wrapper.slurm.commands import NODE_FORMAT

    cfg = Config(paths=PathsConfig(state_dir=str(tmp_path)))
    (tmp_path / "nodes").mkdir()
    cache = tmp_path / "nodes" / "n1.json"
    slurm = FakeSlurm(nodes={"n1": {"NodeName": "n1", "Gres": "gpu:4"}})
    cache.write_text(json.dumps({"at": time.time(), "gpus": 8}))  # before formats: read
    assert configured_gres(cfg, "n1", slurm) == 8
    cache.write_text(json.dumps({"format": NODE_FORMAT + 1, "at": time.time(), "gpus": 8}))
    assert configured_gres(cfg, "n1", slurm) == 4  # asked Slurm, and wrote it over
    assert json.loads(cache.read_text())["format"] == NODE_FORMAT


# -- the archive -------------------------------------------------------------------------------
def _archived_job(tmp_path: Path) -> tuple[Path, Path]:
    from tests.support.archive import write_job

    root = tmp_path / "archive"
    write_job(root, "alice", "7")
    return root, root / "alice" / "7"


def test_a_newer_manifest_is_refused_by_name_and_an_older_one_read(tmp_path: Path) -> None:
    root, job = _archived_job(tmp_path)
    manifest = json.loads((job / "manifest.json").read_text())
    assert archive_store.load_manifest(str(root), "7")["job"]["id"] == manifest["job"]["id"]
    (job / "manifest.json").write_text(json.dumps({**manifest, "schema_version": 2}))
    with pytest.raises(FormatTooNew) as caught:
        archive_store.load_manifest(str(root), "7")
    assert f"{job / 'manifest.json'} is in manifest format 2" in str(caught.value)
    # status of a job this node has no state of reads the archive: the same one line,
    # not "no record of job 7"
    from tests.support.archive import config_file

    for argv in (["status", "7"], ["archive", "show", "7"]):
        result = CliRunner().invoke(cli, ["--config", config_file(tmp_path), *argv])
        assert result.exit_code == 2, result.output
        assert "manifest format 2" in result.stderr and "Traceback" not in result.output


def test_a_newer_archive_part_is_refused_and_an_older_one_read(tmp_path: Path) -> None:
    from wrapper.archive._fs import open_dir, open_root

    root, job = _archived_job(tmp_path)
    [part] = list(job.glob("attempt-*/*/part.json"))
    data = json.loads(part.read_text())
    part.write_text(json.dumps({k: v for k, v in data.items() if k != "format"}))

    def parts() -> list[dict[str, object]]:
        root_fd = open_root(str(root), create=False)
        try:
            user_fd = open_dir(root_fd, "alice")
            job_fd = open_dir(user_fd, "7")
            try:
                return archive_store.read_parts(job_fd, str(job))
            finally:
                os.close(job_fd)
                os.close(user_fd)
        finally:
            os.close(root_fd)

    [read] = parts()
    assert "format" not in read and read["node"] == part.parent.name
    part.write_text(json.dumps({**data, "format": archive_store.PART_FORMAT + 1}))
    with pytest.raises(FormatTooNew, match=f"{part} is in archive part format"):
        parts()


def test_the_indexer_reads_an_older_spool_record_again_and_leaves_a_newer_one(
        tmp_path: Path) -> None:
    from tests.support.archive import config_file

    root, _ = _archived_job(tmp_path)
    config = config_file(tmp_path)
    spool = root / ".index" / "spool"
    for name in os.listdir(spool):
        os.unlink(spool / name)
    # An epilog of a node not yet upgraded spooled schema 1 (its record is made again from
    # the job's manifest); a newer one spooled SCHEMA + 1 (kept for the newer indexer).
    (spool / "1.alice.7.old.json").write_text(json.dumps(
        {"v": 1, "user": "alice", "job_id": "7", "ledger": {"whole": "ledger"}}))
    (spool / "2.alice.8.new.json").write_text(json.dumps(
        {"v": spool_mod.SCHEMA + 1, "user": "alice", "job_id": "8"}))
    from wrapper.config import load

    said: list[str] = []
    index = index_mod.reading(load(config, {}), said.append)
    assert index is not None
    assert [i.job_id for i in index.jobs()] == ["7"]
    assert os.listdir(spool) == ["2.alice.8.new.json"]
    index.close()
    con = sqlite3.connect(root / ".index" / "archive.sqlite")
    [(ledger,)] = con.execute("SELECT ledger FROM jobs WHERE job_id = '7'").fetchall()
    con.close()
    assert "whole" not in ledger and "ettr" in json.loads(ledger)  # this schema's, brief


def test_a_newer_staging_cache_entry_is_a_miss_and_filled_again(
        area: Path, jobs: Jobs, make_dataset: MakeDataset) -> None:
    from wrapper.staging import Cache
    from wrapper.staging.cache import MARKER, MARKER_FORMAT

    dataset = make_dataset(area / "shared" / "ds")
    cache = Cache(area / "cache", max_bytes=64 << 20)
    _, first = jobs.stage(f"{dataset}:data", cache, SETTINGS)
    [marker] = list((area / "cache" / "entries").glob(f"*/{MARKER}"))
    data = json.loads(marker.read_text())
    marker.chmod(0o644)
    marker.write_text(json.dumps({**data, "v": MARKER_FORMAT + 1}))
    _, second = jobs.stage(f"{dataset}:data", cache, SETTINGS)
    assert (first.cache_hit, second.cache_hit) == (False, False)
    assert json.loads(marker.read_text())["v"] == MARKER_FORMAT
    _, third = jobs.stage(f"{dataset}:data", cache, SETTINGS)
    assert third.cache_hit


# -- the previous commit's state, read by this code -------------------------------------------
# One hook of one job, run in a fresh interpreter by whichever code PYTHONPATH names:
# Slurm is a FakeSlurm, the GPUs the fake probe, the detached spawns only recorded.
HOOK = """
import io, json, sys
from pathlib import Path
import wrapper
from wrapper import config
from wrapper.hooks import Services, run_hook
from wrapper.gpu.fake import FakeProbe, parse_inventory
from wrapper.slurm.fake import FakeSlurm
hook, config_path, inventory_path, env, job_state = sys.argv[1:6]
env = json.loads(env)
cfg = config.load(config_path, env)
slurm = FakeSlurm(jobs={"31": {"JobId": "31", "JobState": job_state, "Requeue": "1",
                               "Restarts": env.get("SLURM_JOB_RESTART_COUNT", "0"),
                               "WorkDir": "/tmp", "JobName": "upgrade"}},
                  scripts={"31": "#!/bin/bash\\n#JOBWRAP --max-restarts=3\\ntrue\\n"},
                  nodes={"n1": {"NodeName": "n1", "Gres": "gpu:4"}})
inventory = parse_inventory(Path(inventory_path).read_bytes(), "<n1>")
services = Services(cfg, slurm_factory=lambda: slurm,
                    probe_factory=lambda node: FakeProbe(inventory, "<n1>"),
                    gpu_confirm=lambda node, gpus: [], spawn=lambda argv: None)
out = io.StringIO()
code = run_hook(hook, config_path=config_path, env=env, out=out, services=services)
print(json.dumps({"code": code, "from": wrapper.__file__, "out": out.getvalue()}))
"""


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous commit's ``wrapper`` package, from git: CI's clone holds the history,
    and a checkout without it fails here, saying why, rather than skip the upgrade test."""
    found = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS}^{{commit}}"],
                           capture_output=True, check=False)
    assert found.returncode == 0, (f"commit {PREVIOUS} is not in this checkout's history: "
                                   "clone with history (not --depth) to run the upgrade test")
    tree = tmp_path_factory.mktemp("previous")
    blob = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS, "wrapper"],
                          capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=blob, check=True)
    return tree


def _hook(code_root: Path, hook: str, config: Path, attempt: int, *, job_state: str = "RUNNING",
          exit_code: int = 0) -> dict[str, object]:
    env = slurm_env(hook, SLURM_JOB_RESTART_COUNT=str(attempt), SLURM_RESTART_COUNT=str(attempt),
                    SLURM_JOB_EXIT_CODE2=f"{exit_code}:0",
                    SLURM_JOB_EXIT_CODE=str(exit_code << 8))
    res = subprocess.run([sys.executable, "-c", HOOK, hook, str(config),
                          str(FIXTURES / "healthy-4.toml"), json.dumps(env), job_state],
                         cwd=code_root, env={**os.environ, "PYTHONPATH": str(code_root)},
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    done: dict[str, object] = json.loads(res.stdout.splitlines()[-1])
    assert str(done["from"]).startswith(str(code_root)), done  # that code, not another
    return done


def test_a_job_started_under_the_previous_commit_ends_under_this_one(
        previous: Path, tmp_path: Path) -> None:
    """Attempt 0 runs and fails under the previous commit (prolog, task-prolog, a
    checkpoint, epilog: requeued); attempt 1 starts under it too, jobwrap is upgraded
    while it runs, and this code's epilog ends it: its decision, the archive (the old
    attempt's part with the new one's), the index and ``status`` all read the old state."""
    config = tmp_path / "jobwrap.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path}/state"\n'
                      f'scratch_root = "{tmp_path}/scratch"\n'
                      f'archive_root = "{tmp_path}/archive"\n'
                      f'[log]\nfile = "{tmp_path}/jobwrap.log"\n'
                      f'[gpu]\nbackend = "fake"\nfake_inventory = "{FIXTURES}/healthy-4.toml"\n')
    (tmp_path / "scratch").mkdir()
    state = JobState(tmp_path / "state", "31")
    for hook in ("prolog", "task-prolog"):
        assert _hook(previous, hook, config, 0)["code"] == 0
    state.append("checkpoint", as_user=True, attempt=0, node="n1", path="/ckpt/1", step=1)
    assert _hook(previous, "epilog", config, 0, job_state="FAILED", exit_code=1)["code"] == 0
    for hook in ("prolog", "task-prolog"):
        assert _hook(previous, hook, config, 1)["code"] == 0
    # The upgrade: the old files are all there, in the old shape.
    assert "format" not in json.loads((state.path / "job.json").read_text())
    assert _hook(REPO, "epilog", config, 1, job_state="COMPLETED")["code"] == 0

    log = (tmp_path / "jobwrap.log").read_text()
    assert "hook.bug" not in log and "hook.failed" not in log and "format_too_new" not in log
    ends = [e for e in JobStore(state).root_events() if isinstance(e, ev.AttemptEnd)]
    assert [(e.attempt, e.kind, e.decision) for e in ends] == [
        (0, "user_error", "requeue"), (1, "success", "done")]
    manifest = json.loads((tmp_path / "archive" / "root" / "31" / "manifest.json").read_text())
    assert [(a["attempt"], a["outcome"]) for a in manifest["attempts"]] == [
        (0, "user_error"), (1, "success")]
    assert sorted(manifest["attempts"][0]["files"]) == sorted(manifest["attempts"][1]["files"])
    status = CliRunner().invoke(cli, ["--config", str(config), "status", "31"])
    assert status.exit_code == 0, status.output
    assert "attempt 0" in status.stdout and "attempt 1" in status.stdout
    listed = CliRunner().invoke(cli, ["--config", str(config), "archive", "list"])
    assert listed.exit_code == 0 and "31" in listed.stdout, listed.output
