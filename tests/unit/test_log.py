from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path

import pytest

from wrapper import log


def test_json_file_and_logfmt_stderr(tmp_path: Path) -> None:
    err = io.StringIO()
    log.configure(file=str(tmp_path / "j.log"), level="info", stderr_format="logfmt", stderr=err)
    log.bind(hook="epilog", job_id="9", node="n2", attempt=0)
    log.get().info("epilog.done", exit_code=3, note="two words")
    log.get().debug("hidden")
    [record] = [json.loads(x) for x in (tmp_path / "j.log").read_text().splitlines()]
    assert record["event"] == "epilog.done"
    assert (record["hook"], record["job_id"], record["node"], record["attempt"]) == \
        ("epilog", "9", "n2", 0)
    [line] = err.getvalue().splitlines()
    assert line.startswith("jobwrap[")
    assert "info: epilog.done" in line
    assert 'note="two words"' in line and "exit_code=3" in line and "node=n2" in line


@pytest.fixture
def syslogged(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """What would have gone to syslog: (level, logfmt line)."""
    lines: list[tuple[str, str]] = []
    monkeypatch.setattr(log, "_syslog", lambda level, line: lines.append((level, line)))
    return lines


def test_unwritable_log_file_falls_back_to_stderr_and_syslog(
        tmp_path: Path, syslogged: list[tuple[str, str]]) -> None:
    (tmp_path / "a-file").write_text("")  # its "folder" cannot be made by anyone
    err = io.StringIO()
    log.configure(file=str(tmp_path / "a-file" / "missing" / "j.log"), stderr_format="json",
                  stderr=err)
    log.get().info("still.here")
    records = [json.loads(x) for x in err.getvalue().splitlines()]
    assert [r["event"] for r in records] == ["log.file_unavailable", "still.here"]
    assert "Not a directory" in records[0]["detail"]
    assert "logging to syslog" in records[0]["action"]
    assert [level for level, _ in syslogged] == ["warning", "info"]
    assert syslogged[0][1].startswith("warning: log.file_unavailable detail=")
    assert syslogged[1][1] == "info: still.here"  # syslog prefixes jobwrap[PID] itself


def test_a_writable_log_file_sends_nothing_to_syslog(
        tmp_path: Path, syslogged: list[tuple[str, str]]) -> None:
    log.configure(file=str(tmp_path / "j.log"), stderr_format="json", stderr=io.StringIO())
    log.get().info("here")
    assert syslogged == [] and "here" in (tmp_path / "j.log").read_text()


root_only = pytest.mark.usefixtures("root")  # root makes the folder (tests/conftest.py)


@root_only
def test_root_makes_a_missing_log_folder_of_its_own(tmp_path: Path,
                                                    syslogged: list[tuple[str, str]]) -> None:
    old = os.umask(0o077)  # whatever the umask, the folder is 0750
    try:
        log.configure(file=str(tmp_path / "jobwrap" / "jobwrap.log"), stderr_format="json",
                      stderr=io.StringIO())
    finally:
        os.umask(old)
    log.get().info("first.line")
    folder = (tmp_path / "jobwrap").lstat()
    assert stat.S_ISDIR(folder.st_mode) and stat.S_IMODE(folder.st_mode) == log.LOG_FOLDER_MODE
    assert (folder.st_uid, folder.st_gid) == (0, 0)
    assert not (tmp_path / "jobwrap" / "jobwrap.log").stat().st_mode & 0o007
    assert "first.line" in (tmp_path / "jobwrap" / "jobwrap.log").read_text()
    assert syslogged == []


@root_only
@pytest.mark.parametrize(("setup", "phrase"), [
    ("symlink", "is a symlink"),
    ("not-root", "owned by uid 4242, not root"),
    ("world-writable", "writable by others"),
    ("missing-in-open-parent", "is missing, and"),
    # a group other than root's may write there: it could put a FIFO in the log's place
    ("group-writable", "writable by others"),
    # a FIFO in the log's place (opened non-blocking: no reader, no hung hook)
    ("fifo", "No such device or address"),
])
def test_root_writes_no_log_into_a_folder_others_control(
        tmp_path: Path, syslogged: list[tuple[str, str]], setup: str, phrase: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folder = tmp_path / "jobwrap"
    if setup == "symlink":
        folder.symlink_to(elsewhere)
    elif setup == "missing-in-open-parent":
        os.chmod(tmp_path, 0o777)  # noqa: S103 - the fault under test
    else:
        folder.mkdir()
        if setup == "not-root":
            os.chown(folder, 4242, 4242)
        elif setup == "group-writable":
            os.chown(folder, 0, 4242)
            os.chmod(folder, 0o770)  # noqa: S103 - the fault under test
        elif setup == "fifo":
            os.chmod(folder, 0o750)  # noqa: S103 - root's own mode
            os.mkfifo(folder / "jobwrap.log")
        else:
            os.chmod(folder, 0o777)  # noqa: S103 - the fault under test
    err = io.StringIO()
    log.configure(file=str(folder / "jobwrap.log"), stderr_format="json", stderr=err)
    [record] = [json.loads(x) for x in err.getvalue().splitlines()]
    assert record["event"] == "log.file_unavailable" and phrase in record["detail"], record
    assert [level for level, _ in syslogged] == ["warning"]
    if setup == "fifo":
        assert stat.S_ISFIFO((folder / "jobwrap.log").lstat().st_mode)
    else:
        assert not (folder / "jobwrap.log").exists()
    assert list(elsewhere.iterdir()) == []
    if setup == "missing-in-open-parent":
        assert not folder.exists()


def test_console_form(tmp_path: Path) -> None:
    err = io.StringIO()
    log.configure(stderr_format="console", stderr=err)
    log.get().warning("gpu.hot", gpu=1)
    assert "gpu.hot" in err.getvalue() and "gpu=1" in err.getvalue()


def test_a_capped_log_writes_one_capped_line_then_nothing(tmp_path: Path) -> None:
    path = tmp_path / "supervisor.log"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    log.configure(file_fd=fd, stderr_format="json", stderr=io.StringIO(), max_bytes=1000)
    for i in range(100):
        log.get().info("supervisor.tick", i=i)
    lines = path.read_text().splitlines()
    assert json.loads(lines[-1])["event"] == "log.capped"
    assert sum(len(line) + 1 for line in lines[:-1]) <= 1000 < path.stat().st_size
    assert [json.loads(line)["event"] for line in lines[:-1]] == ["supervisor.tick"] * (
        len(lines) - 1)
