from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from wrapper.errors import CommandError, CommandTimeout
from wrapper.runner import Runner


def test_output_and_input() -> None:
    res = Runner().run(["cat"], timeout=5, input="hello\n")
    assert (res.returncode, res.stdout) == (0, "hello\n")


def test_failure_names_the_command_and_its_stderr() -> None:
    with pytest.raises(CommandError) as info:
        Runner().run(["sh", "-c", "echo 'scontrol: error: Invalid node name' >&2; exit 3"],
                     timeout=5)
    message = str(info.value)
    assert "failed with exit code 3" in message
    assert "Invalid node name" in message
    assert "sh -c" in message


def test_missing_command() -> None:
    with pytest.raises(CommandError, match="was not found"):
        Runner().run(["/nonexistent/scontrol", "ping"], timeout=5)


def test_no_check_returns_the_failure() -> None:
    assert Runner().run(["false"], timeout=5, check=False).returncode == 1


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    started = time.monotonic()
    with pytest.raises(CommandTimeout, match=r"timed out after 0\.5 s"):
        Runner().run(["sh", "-c", f"sleep 60 & echo $! > '{pidfile}'; wait"], timeout=0.5)
    assert time.monotonic() - started < 10
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child), "the grandchild outlived the timeout"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_env_is_passed() -> None:
    res = Runner({"PATH": os.environ["PATH"], "SLURM_CONF": "/x/slurm.conf"}).run(
        ["sh", "-c", "echo $SLURM_CONF"], timeout=5)
    assert res.stdout.strip() == "/x/slurm.conf"
