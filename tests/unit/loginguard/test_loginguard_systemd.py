"""systemd/jobwrap-login-guard.service: valid for systemd, hardened, least capabilities."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[3] / "systemd" / "jobwrap-login-guard.service"
INSTALLED_BINARY = "/opt/jobwrap/venv/bin/jobwrap"


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.fail("systemd-analyze is missing, so the unit cannot be verified: install "
                    "it (Debian: apt-get install -y systemd) and run the tests again")
    return found


def service_section() -> dict[str, str]:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return dict(parser["Service"])


def installable_copy(tmp_path: Path) -> Path:
    """The unit, with ExecStart's binary pointing at a stand-in that exists here.

    ``verify`` checks that the binary exists; on this machine jobwrap is not installed
    under /opt, and everything else in the unit is verified as written.
    """
    text = UNIT.read_text()
    exec_line = f"ExecStart={INSTALLED_BINARY} login-guard\n"
    assert exec_line in text, "ExecStart must run the installed jobwrap's login-guard verb"
    stand_in = tmp_path / "jobwrap"
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    copy = tmp_path / UNIT.name
    copy.write_text(text.replace(exec_line, f"ExecStart={stand_in} login-guard\n"))
    return copy


def test_systemd_analyze_verify_accepts_the_unit_without_a_warning(tmp_path: Path) -> None:
    unit = installable_copy(tmp_path)
    res = subprocess.run([systemd_analyze(), "verify", "--man=no", str(unit)],
                         capture_output=True, text=True, check=False, timeout=60)
    assert res.returncode == 0, res.stderr
    # verify exits 0 on unknown keys and bad values ("..., ignoring"): any output is a fault
    assert res.stderr.strip() == "" and res.stdout.strip() == "", res.stderr + res.stdout


def test_the_unit_is_hardened_with_the_least_capabilities() -> None:
    service = service_section()
    assert set(service["CapabilityBoundingSet"].split()) == {
        "CAP_KILL", "CAP_SYS_NICE", "CAP_SYS_PTRACE"}
    assert service["AmbientCapabilities"] == ""
    assert service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] == "strict"
    assert "/var/lib/jobwrap" in service["ReadWritePaths"].split()
    assert service["ProtectHome"] == "read-only"
    assert service["PrivateTmp"] == "yes"
    assert service["SupplementaryGroups"] == "tty"  # terminals, without CAP_DAC_OVERRIDE
    assert service["Restart"] == "on-failure"
    # It must see every process it guards.
    assert "ProtectProc" not in service and "ProcSubset" not in service


def test_the_exposure_score_stays_low(tmp_path: Path) -> None:
    unit = installable_copy(tmp_path)
    # --threshold is in tenths: 35 means an overall exposure of at most 3.5 of 10.
    res = subprocess.run([systemd_analyze(), "security", "--offline=true", "--threshold=35",
                          str(unit)], capture_output=True, text=True, check=False, timeout=60)
    assert "Overall exposure level" in res.stdout, res.stderr
    assert res.returncode == 0, res.stdout.splitlines()[-1]
