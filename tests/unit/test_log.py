from __future__ import annotations

import io
import json
import os
from pathlib import Path

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


def test_unwritable_log_file_falls_back_to_stderr(tmp_path: Path) -> None:
    err = io.StringIO()
    log.configure(file=str(tmp_path / "missing" / "j.log"), stderr_format="json", stderr=err)
    log.get().info("still.here")
    events = [json.loads(x)["event"] for x in err.getvalue().splitlines()]
    assert events == ["log.file_unavailable", "still.here"]


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
