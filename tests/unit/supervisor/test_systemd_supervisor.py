"""systemd/jobwrap-supervisor@.service: hardened as docs/systemd.md says, and the security
score written there is the real one. That systemd-analyze verify accepts it, that the job's
save file can be made under its restrictions, and that it reads the hooks' settings:
tests/unit/test_systemd_units.py."""

from __future__ import annotations

import re
import shlex
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
    """A file system root holding the unit, a stub at the program it starts and systemd's
    own units (systemd-analyze checks that ExecStart's program exists, and resolves
    dependencies there)."""
    assert SYSTEM_UNITS.is_dir(), f"{SYSTEM_UNITS} is missing: apt-get install -y systemd"
    root = tmp_path / "root"
    shutil.copytree(SYSTEM_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    (root / "lib").symlink_to("usr/lib")
    (root / "etc/systemd/system").mkdir(parents=True)
    shutil.copy(UNIT, root / "etc/systemd/system" / UNIT.name)
    program = root / shlex.split(_directives(UNIT.read_text())["ExecStart"][0])[0].lstrip("/")
    program.parent.mkdir(parents=True, exist_ok=True)
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


def test_hardening_as_documented() -> None:
    unit = _directives(UNIT.read_text())
    # the hooks' program and settings, through their own prolog/hook-env.sh
    assert unit["ExecStart"] == [
        "/bin/sh -c '. /opt/jobwrap/prolog/hook-env.sh && exec \"$$JOBWRAP_BIN\" supervise "
        "\"$$1\"' /opt/jobwrap/prolog/hook-env.sh %i"]
    assert "EnvironmentFile" not in unit  # systemd's per-key merge is not the hooks' rule
    assert unit["CapabilityBoundingSet"] == ["CAP_SETUID CAP_SETGID"]
    assert unit["NoNewPrivileges"] == ["yes"]
    # the save file goes into the job's checkpoint folder, wherever that is
    assert unit["ProtectSystem"] == ["full"]
    assert unit["ProtectHome"] == ["no"]
    assert unit["PrivateTmp"] == ["no"]
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
