"""The archive's index (wrapper/archive/index.py): the epilog's spool, one indexer, a
rebuild from the manifests, and the faults of issue 26: a missing or damaged index, a
manifest that does not parse, a spool write that fails, a lock held, two indexers at
once, an ordinary user reading through it. Real files and a real SQLite database."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.support.archive import NOW, config_file, write_job
from wrapper.archive import index as index_mod
from wrapper.archive import spool as spool_mod
from wrapper.archive import store
from wrapper.archive.index import SqliteIndex
from wrapper.cli import cli
from wrapper.config import load
from wrapper.goodput import report
from wrapper.osl.child import call_as
from wrapper.osl.users import UserIds

DAY = 86400.0


def jobwrap(cfg: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--config", cfg, *args])
    return result.exit_code, result.stdout, result.stderr


def spooled(root: Path) -> list[str]:
    return sorted(os.listdir(root / ".index" / "spool"))


def test_the_epilog_spools_a_record_and_the_first_reader_builds_the_index(
        root: Path, config_path: str) -> None:
    write_job(root, "alice", "1", kinds=("hang", "success"))
    assert len(spooled(root)) == 1 and not (root / ".index" / "archive.sqlite").exists()
    code, out, err = jobwrap(config_path, "archive", "list", "--json")
    assert code == 0 and [i["job_id"] for i in json.loads(out)] == ["1"]
    assert err.count("\n") == 1 and "no index" in err and "built it again" in err
    assert spooled(root) == []
    write_job(root, "bob", "2")
    code, out, err = jobwrap(config_path, "archive", "list", "--json")  # folds, says nothing
    assert code == 0 and err == ""
    assert [(i["user"], i["job_id"], i["attempts"]) for i in json.loads(out)] == [
        ("alice", "1", [0, 1]), ("bob", "2", [0])]
    assert spooled(root) == []
    write_job(root, "bob", "3")
    code, out, err = jobwrap(config_path, "archive", "index")  # a timer's way
    assert (code, spooled(root)) == (0, []) and "folded 1 records" in err


def test_the_indexer_records_its_run_and_doctor_tells_a_stale_spool(
        root: Path, shared: Path) -> None:
    """jobwrap archive index (the timer's) leaves its record and the metrics; doctor
    warns when a spool record waits past INDEXER_LATE_S, and names the timer."""
    from wrapper.doctor import INDEXER_LATE_S, check_indexer

    metrics = shared / "jobwrap.prom"
    config_path = config_file(shared)
    with open(config_path, "a") as handle:
        handle.write(f'[metrics]\ntextfile = "{metrics}"\n')
    cfg = load(config_path)
    write_job(root, "alice", "1")
    [name] = spooled(root)
    old = time.time() - INDEXER_LATE_S - 60
    os.utime(root / ".index" / "spool" / name, (old, old))
    found = check_indexer(cfg)
    assert found.status == "warn" and "never run by `jobwrap archive index`; 1 record in " \
        "the spool, the oldest 31m" in found.detail and "jobwrap-indexer.timer" in found.fix
    code, _, err = jobwrap(config_path, "archive", "index")
    assert code == 0 and "built it again from the manifests" in err, err  # none yet
    found = check_indexer(cfg)
    assert found.status == "pass" and found.detail.startswith("last run ") and \
        found.detail.endswith("ago; 0 records in the spool"), found
    ran = json.loads((root / ".index" / index_mod.LAST_RUN).read_text())
    assert ran["folded"] == 1 and ran["rebuilt"] is True  # no index yet: built
    text = metrics.read_text()
    assert "jobwrap_archive_spool_records 0" in text and \
        "jobwrap_archive_indexer_folded_total 1" in text, text
    write_job(root, "bob", "2")  # a fresh record is no backlog to warn of
    assert check_indexer(cfg).status == "pass"


def test_the_index_is_private_and_its_summary_holds_no_row(root: Path) -> None:
    write_job(root, "alice", "1", kinds=("hardware", "success"))
    SqliteIndex(str(root)).rebuild()
    modes = {name: stat.S_IMODE(os.stat(root / ".index" / name).st_mode)
             for name in ("", "spool", "archive.sqlite", "summary.json")}
    assert modes == {"": 0o711, "spool": 0o700, "archive.sqlite": 0o600,
                     "summary.json": 0o644}
    summary = json.loads((root / ".index" / "summary.json").read_text())
    assert set(summary) == {"written_at", "window_s", "mtbf_s"}
    assert summary["mtbf_s"] == pytest.approx(6000.0)  # 2 x 3000 s of attempts, 1 failure


def test_a_damaged_index_is_rebuilt_with_one_line_and_no_traceback(
        root: Path, config_path: str) -> None:
    write_job(root, "alice", "1")
    SqliteIndex(str(root)).rebuild()
    (root / ".index" / "archive.sqlite").write_bytes(b"not a database at all " * 400)
    code, out, err = jobwrap(config_path, "report", "--since", "1d", "--json")
    assert code == 0 and json.loads(out)["report"]["jobs"] == 1
    assert err.count("\n") == 1 and "damaged" in err and "Traceback" not in err
    code, out, err = jobwrap(config_path, "archive", "list")
    assert code == 0 and err == "" and "alice" in out


def test_an_index_of_an_older_schema_is_rebuilt(root: Path, config_path: str) -> None:
    write_job(root, "alice", "1")
    SqliteIndex(str(root)).rebuild()
    con = sqlite3.connect(root / ".index" / "archive.sqlite")
    con.execute(f"PRAGMA user_version = {spool_mod.SCHEMA - 1}")
    con.close()
    said: list[str] = []
    index = index_mod.reading(load(config_path), said.append)
    assert index is not None and [i.job_id for i in index.jobs()] == ["1"]
    assert len(said) == 1 and f"schema {spool_mod.SCHEMA - 1}" in said[0]


def test_a_newer_jobwraps_index_is_left_as_it_is_and_the_manifests_are_read(
        root: Path, config_path: str) -> None:
    """A downgrade (or an upgrade not finished on the admin node): the newer index is not
    this jobwrap's to rebuild; the commands say so in one line and read the manifests."""
    write_job(root, "alice", "1")
    SqliteIndex(str(root)).rebuild()
    database = root / ".index" / "archive.sqlite"
    con = sqlite3.connect(database)
    con.execute(f"PRAGMA user_version = {spool_mod.SCHEMA + 1}")
    con.close()
    said: list[str] = []
    assert index_mod.reading(load(config_path), said.append) is None
    [line] = said
    assert f"{database} is in archive index format {spool_mod.SCHEMA + 1}" in line
    assert "install the same jobwrap on every node" in line and "manifests instead" in line
    con = sqlite3.connect(database)  # untouched: still the newer jobwrap's
    assert con.execute("PRAGMA user_version").fetchone()[0] == spool_mod.SCHEMA + 1
    con.close()
    code, out, err = jobwrap(config_path, "archive", "list")
    assert code == 0 and "alice" in out and "Traceback" not in err


def test_a_manifest_that_does_not_parse_is_named_listed_and_left_out_of_reports(
        root: Path, config_path: str) -> None:
    write_job(root, "alice", "1")
    write_job(root, "alice", "2")
    (root / "alice" / "2" / "manifest.json").write_text('{"attempts": [')
    code, out, err = jobwrap(config_path, "archive", "reindex")
    assert code == 0 and "alice/2" in out + err and "do not parse" in out + err
    code, out, err = jobwrap(config_path, "archive", "list", "--json")
    assert [i["job_id"] for i in json.loads(out)] == ["1", "2"]  # prune still sees it
    code, out, err = jobwrap(config_path, "report", "--since", "1d", "--json")
    data = json.loads(out)
    assert data["report"]["jobs"] == 1
    assert data["problems"] == ["job 2 of alice: its manifest does not parse or lists no "
                                "attempts"]


@pytest.mark.parametrize("fault", ["disk_full", "index_folder_is_a_file"])
def test_a_spool_write_that_fails_never_fails_the_archive_nor_loses_the_manifest(
        shared: Path, root: Path, monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    write_job(root, "alice", "1")
    if fault == "disk_full":
        def full(*_: object, **__: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(spool_mod, "write_json_atomic", full)
    else:
        os.rename(root / ".index", shared / "old-index")
        (root / ".index").write_text("in the way")
    manifest = write_job(root, "alice", "2")
    on_disk = json.loads((root / "alice" / "2" / "manifest.json").read_text())
    assert on_disk == manifest  # the manifest is whole
    if fault == "index_folder_is_a_file":
        os.unlink(root / ".index")
    monkeypatch.undo()
    found = SqliteIndex(str(root)).rebuild()  # what the log line says to run
    assert found.jobs == 2


def test_a_lock_held_by_another_indexer_reads_the_index_as_it_is(
        root: Path, config_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    write_job(root, "alice", "1")
    SqliteIndex(str(root)).rebuild()
    write_job(root, "alice", "2")
    monkeypatch.setattr(index_mod, "LOCK_WAIT_S", 0.2)
    fd = os.open(root / ".index" / "indexer.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        said: list[str] = []
        index = index_mod.reading(load(config_path), said.append)
        assert index is not None and [i.job_id for i in index.jobs()] == ["1"]
        assert len(said) == 1 and "locked" in said[0] and "newest" in said[0]
    finally:
        os.close(fd)
    index = index_mod.reading(load(config_path), said.append)
    assert index is not None and [i.job_id for i in index.jobs()] == ["1", "2"]


INDEXER = """
import sys
from wrapper.archive.index import SqliteIndex
index = SqliteIndex(sys.argv[1], lock_wait=60)
print("ready", flush=True)
for round in range(int(sys.argv[2])):
    index.rebuild() if round % 3 == 0 else index.fold()
print("done")
"""


def test_two_indexers_at_once_never_corrupt_the_index(root: Path) -> None:
    for n in range(30):
        write_job(root, f"u{n % 3}", str(100 + n), kinds=("hardware", "success"))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    procs = [subprocess.Popen([sys.executable, "-c", INDEXER, str(root), "30"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    assert [p.stdout.readline() for p in procs if p.stdout] == ["ready\n", "ready\n"]
    for n in range(30, 60):  # epilogs go on spooling while both fold and rebuild
        write_job(root, f"u{n % 3}", str(100 + n))
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    assert all(out == "done\n" for out, _ in results)
    index = SqliteIndex(str(root))
    index.fold()
    con = sqlite3.connect(index.path)
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    con.close()
    assert sorted(int(i.job_id) for i in index.jobs()) == list(range(100, 160))
    assert spooled(root) == []


def test_an_ordinary_user_reads_no_other_users_row(
        user: UserIds, root: Path, config_path: str) -> None:
    write_job(root, user.name, "1", gid=user.gid)
    write_job(root, "someone", "2")
    code, out, _ = jobwrap(config_path, "archive", "list", "--json")  # root: both, index built
    assert code == 0 and [i["user"] for i in json.loads(out)] == [user.name, "someone"]

    def as_the_user() -> list[Any]:
        try:
            with open(root / ".index" / "archive.sqlite", "rb"):
                opened = "opened"
        except PermissionError:
            opened = "refused"
        listed = CliRunner().invoke(cli, ["--config", config_path, "archive", "list", "--json"])
        reported = CliRunner().invoke(cli, ["--config", config_path, "report", "--since", "1d",
                                            "--json"])
        return [opened, index_mod.may_read(str(root)),
                [i["user"] for i in json.loads(listed.stdout)],
                json.loads(reported.stdout)["report"]["jobs"]]

    assert call_as(user, as_the_user) == ["refused", False, [user.name], 1]


def test_commands_open_no_manifest_they_do_not_need(
        shared: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for n in range(20):
        write_job(root, "alice", str(n + 1), age_s=(n + 1) * DAY,
                  kinds=("hang", "success") if n % 2 else ("success",))
    cfg = config_file(shared, "max_age_days = 10.0\n")
    assert jobwrap(cfg, "archive", "reindex")[0] == 0
    opened: list[str] = []
    real = store.read_json

    def counting(parent: int, name: str) -> dict[str, Any] | None:
        opened.append(name)
        return real(parent, name)

    monkeypatch.setattr(store, "read_json", counting)
    code, out, _ = jobwrap(cfg, "report", "--since", "3d", "--json")
    assert code == 0 and json.loads(out)["report"]["jobs"] == 2 and opened == []
    code, out, _ = jobwrap(cfg, "archive", "prune", "--dry-run", "--json")
    assert code == 0 and len(json.loads(out)) == 11 and opened == []  # 10 days or more
    code, out, _ = jobwrap(cfg, "status", "7", "--json")
    assert code == 0 and json.loads(out)["source"] == "archive"
    assert opened == ["manifest.json"]  # the job's own, once
    # without the index (an ordinary user's way): folders older than --since stay shut
    opened.clear()
    for n in range(20):
        stamp = NOW - (n + 1) * DAY
        os.utime(root / "alice" / str(n + 1), (stamp, stamp))
    jobs, problems = report.from_archive(str(root), since=NOW - 2.5 * DAY, now=NOW)
    assert len(jobs) == 2 and problems == [] and opened == ["manifest.json"] * 2


def test_the_index_tells_what_the_manifests_tell(root: Path) -> None:
    for n in range(12):
        kinds = (("hardware", "success"), ("hang", "node_failure", "success"),
                 ("success",))[n % 3]
        write_job(root, f"u{n % 2}", str(n + 1), age_s=(n + 1) * 3600, kinds=kinds,
                  nodes=(f"n{n % 4}", f"n{n % 5}"))
    index = SqliteIndex(str(root))
    index.rebuild()
    since = NOW - 8 * 3600
    scanned, _ = report.from_archive(str(root), since=since, now=NOW)
    indexed, _ = report.from_index(index, since=since)
    by_scan = report.build(scanned, since=since)
    by_index = report.build(indexed, since=since)
    assert by_index.as_dict() == by_scan.as_dict()
    assert by_index.jobs == 8 and by_index.nodes
    assert index.mtbf(since) == pytest.approx(by_scan.mtbf_s)
    assert [i.as_dict() for i in index.jobs(since=since, user="u1")] == [
        i.as_dict() for i in store.list_archives(str(root), "u1", since)]


@pytest.mark.parametrize("limits", ["max_age_days = 10.0\n",
                                    "max_age_days = 10.0\nmax_total_gb = 0.0000001\n",
                                    "max_age_days = 0.0\nmax_total_gb = 0.00000005\n"])
def test_prune_through_the_index_removes_what_the_walk_would(
        shared: Path, root: Path, limits: str) -> None:
    for n in range(16):
        write_job(root, f"u{n % 3}", str(n + 1), age_s=(n + 1) * DAY)
    cfg = config_file(shared, limits)
    settings = load(cfg).archive
    walked = store.prune(str(root), settings.max_age_days,
                         int(settings.max_total_gb * (1 << 30)), time.time(), dry_run=True)
    code, out, _ = jobwrap(cfg, "archive", "prune", "--dry-run", "--json")
    assert code == 0
    assert [(r["job_id"], r["reason"]) for r in json.loads(out)] == [
        (r.info.job_id, r.reason) for r in walked]
    assert {r.reason for r in walked} == ({"age"} if "total" not in limits else
                                          {"size"} if "= 0.0\n" in limits else {"age", "size"})
    code, out, _ = jobwrap(cfg, "archive", "prune", "--json")
    assert code == 0 and len(json.loads(out)) == len(walked)
    code, out, _ = jobwrap(cfg, "archive", "list", "--json")
    assert sorted(i["job_id"] for i in json.loads(out)) == sorted(
        i.job_id for i in store.list_archives(str(root)))  # the index forgot them


def test_list_streams_what_json_dumps_would_print(root: Path, config_path: str) -> None:
    for n in range(3):
        write_job(root, "alice", str(n + 1), age_s=(n + 1) * 60)
    SqliteIndex(str(root)).rebuild()
    code, out, _ = jobwrap(config_path, "archive", "list", "--json")
    expected = json.dumps([i.as_dict() for i in SqliteIndex(str(root)).jobs()], indent=2)
    assert code == 0 and out == expected + "\n"
    code, out, err = jobwrap(config_path, "archive", "list", "--json", "--user", "nobody")
    assert (code, out) == (0, "[]\n")
    code, out, err = jobwrap(config_path, "archive", "list", "--user", "nobody")
    assert (code, out, err) == (0, "", "no archives\n")


def test_an_index_that_cannot_be_built_falls_back_to_the_manifests(
        shared: Path, root: Path) -> None:
    write_job(root, "alice", "1")
    cfg = config_file(shared, f'index_path = "{shared}/no-such-folder/index.sqlite"\n')
    code, out, err = jobwrap(cfg, "archive", "list", "--json")
    assert code == 0 and [i["job_id"] for i in json.loads(out)] == ["1"]
    assert err.count("\n") == 1 and "cannot be used" in err and "Traceback" not in err
    code, out, err = jobwrap(cfg, "archive", "reindex")
    assert code != 0 and "cannot write the archive index" in out + err
    assert "Traceback" not in out + err
