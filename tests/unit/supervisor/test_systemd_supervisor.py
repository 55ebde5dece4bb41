"""systemd/jobwrap-supervisor@.service: valid for systemd-analyze verify, hardened as
docs/systemd.md says, and the security score written there is the real one."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
UNIT = REPO / "systemd" / "jobwrap-supervisor@.service"
DOCS = REPO / "docs" / "systemd.md"
SYSTEM_UNITS = Path("/usr/lib/systemd/system")
INSTANCE = "jobwrap-supervisor@4242.service"


def _analyze() -> str:
    found = shutil.which("systemd-analyze")
    assert found, "systemd-analyze is missing: apt-get install -y systemd"
    return found


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A file system root holding the unit, the program it starts and systemd's own units
    (verify checks that ExecStart's program exists, and resolves dependencies there)."""
    assert SYSTEM_UNITS.is_dir(), f"{SYSTEM_UNITS} is missing: apt-get install -y systemd"
    root = tmp_path / "root"
    shutil.copytree(SYSTEM_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    (root / "lib").symlink_to("usr/lib")
    (root / "etc/systemd/system").mkdir(parents=True)
    shutil.copy(UNIT, root / "etc/systemd/system" / UNIT.name)
    program = root / "opt/jobwrap/venv/bin/jobwrap"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    return root


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_analyze(), *args], capture_output=True, text=True, timeout=120,
                          check=False)


def _directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def test_verify_passes_without_a_word(root: Path) -> None:
    result = _run("verify", f"--root={root}", INSTANCE)
    # verify only warns (exit 0) about unknown keys: any output is a failure here.
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_verify_catches_what_is_wrong(root: Path) -> None:
    """The check can fail: a misspelt key and a missing program are both reported."""
    unit = root / "etc/systemd/system" / UNIT.name
    unit.write_text(unit.read_text().replace("ProtectHome=", "ProtectHomes="))
    assert "Unknown key 'ProtectHomes'" in _run("verify", f"--root={root}", INSTANCE).stderr
    (root / "opt/jobwrap/venv/bin/jobwrap").unlink()
    assert _run("verify", f"--root={root}", INSTANCE).returncode != 0


def test_hardening_as_documented() -> None:
    unit = _directives(UNIT.read_text())
    assert unit["ExecStart"] == ["/opt/jobwrap/venv/bin/jobwrap supervise %i"]
    assert unit["CapabilityBoundingSet"] == ["CAP_SETUID CAP_SETGID"]
    assert unit["NoNewPrivileges"] == ["yes"]
    assert unit["PrivateTmp"] == ["yes"]
    assert unit["ProtectSystem"] == ["strict"]
    assert unit["ProtectHome"] == ["read-only"]  # checkpoints and output under /home
    assert unit["ReadWritePaths"] == ["-/var/lib/jobwrap"]
    assert unit["Restart"] == ["on-failure"]
    assert int(unit["StartLimitBurst"][0]) <= 5
    assert "User" not in unit  # it starts as root and drops to the job user itself
    assert "ProtectClock" not in unit  # its device allow-list would hide /dev/nvidia*


def test_the_documented_security_score_is_the_real_one(root: Path) -> None:
    result = _run("security", "--offline=true", f"--root={root}", INSTANCE)
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", result.stdout)
    assert match, result.stdout + result.stderr
    score, verdict = float(match.group(1)), match.group(2)
    assert score <= 3.0, f"exposure {score} {verdict}: the unit lost some hardening"
    assert f"**{match.group(1)} {verdict}**" in DOCS.read_text(), (
        f"docs/systemd.md must give the score systemd-analyze reports: {score} {verdict}")
