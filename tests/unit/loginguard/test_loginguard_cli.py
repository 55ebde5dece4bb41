"""``jobwrap login-guard`` as a real command, run as the non-root test user.

Run as that user, a guard can only signal that user's processes (the kernel sees to
it), so these tests cannot touch anything they did not start even if the guard were
wrong; the processes they start are killed by pid when each test ends.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.loginguard.procs import (
    BURN,
    SLEEP,
    TEST_USER,
    Procs,
    guard_config,
    procs_fixture,
    wait_until,
)
from wrapper.config import Config, LogConfig, to_toml
from wrapper.loginguard.state import ActionRecord, GuardState, StateStore, Violation

JOBWRAP = str(Path(sys.executable).parent / "jobwrap")


@pytest.fixture
def procs() -> Iterator[Procs]:
    yield from procs_fixture()


def write_config(procs: Procs, **settings: Any) -> tuple[Path, Path, Path]:
    """A config the test user can read, with a state folder and a log it can write."""
    user = pwd.getpwnam(TEST_USER)
    state = procs.shared / "state"
    state.mkdir()
    os.chown(state, user.pw_uid, user.pw_gid)
    log = procs.shared / "guard.log"
    log.touch()
    os.chown(log, user.pw_uid, user.pw_gid)
    # The project's other test users run Slurm jobs on this machine meanwhile: this
    # guard (which sees every process) must not judge them.
    config = guard_config(state, **{"cpu_share": 1.0,
                                    "exempt_users": ("jwtest", "jwrival"), **settings})
    config = Config(paths=config.paths, login_guard=config.login_guard,
                    log=LogConfig(file=str(log), stderr_format="json"))
    path = procs.shared / "config.toml"
    path.write_text(to_toml(config))
    path.chmod(0o644)
    return path, state, log


def run_guard(procs: Procs, program: str, config: Path, *args: str) -> tuple[int, str, int]:
    """``jobwrap login-guard ARGS`` as the test user: (exit code, stdout, its pid)."""
    guard = procs.start([program, "--config", str(config), "login-guard", *args],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = guard.communicate(timeout=120)
    assert guard.returncode == 0, err.decode()
    return guard.returncode, out.decode(), guard.pid


def events(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_the_verb_is_registered() -> None:
    res = subprocess.run([JOBWRAP, "login-guard", "--help"], capture_output=True, text=True,
                         check=False)
    assert res.returncode == 0, res.stderr
    assert "--once" in res.stdout and "--dry-run" in res.stdout and "status" in res.stdout


def test_the_guard_never_kills_itself_nor_shells_nor_sshd(procs: Procs,
                                                          user_jobwrap: str) -> None:
    # Every one of these matches an AI signature, so every one would be terminated if
    # the guard did not protect itself, shells and sessions; only torchrun may die.
    shell = procs.start(["bash", "-c", "sleep 300; true"])
    sshd = procs.start([str(procs.system_copy("sshd", "/bin/sleep")), "300"])
    torchrun = procs.python(SLEEP, argv0="torchrun")
    config, state, log = write_config(
        procs, ai_commands=("jobwrap", "bash", "sshd", "torchrun"),
        ai_actions=("terminate",), kill_grace=1.0)
    _, out, guard_pid = run_guard(procs, user_jobwrap, config, "--once")
    assert torchrun.wait(timeout=10) in (-signal.SIGTERM, -signal.SIGKILL)
    assert shell.poll() is None and sshd.poll() is None
    # The guard did see itself as an AI workload: it was protected, not overlooked.
    assert f"{guard_pid} " in out and "runs jobwrap" in out
    assert "runs bash" in out and "runs sshd" in out
    acted = [e for e in events(log) if e["event"] == "login_guard.action"]
    assert [(e["action"], e["pids"]) for e in acted] == [("terminate", [torchrun.pid])]
    # status reads what that run recorded
    res = subprocess.run([JOBWRAP, "--config", str(config), "login-guard", "status"],
                         capture_output=True, text=True, check=True)
    assert TEST_USER in res.stdout and "terminate" in res.stdout and "ai" in res.stdout
    res = subprocess.run([JOBWRAP, "--config", str(config), "login-guard", "status", "--json"],
                         capture_output=True, text=True, check=True)
    shown = json.loads(res.stdout)
    assert [v["rule"] for v in shown["violations"]] == ["ai"]
    assert [a["action"] for a in shown["history"]] == ["terminate"]
    assert shown["state_file"] == str(state / "login-guard" / "state.json")


def test_dry_run_acts_on_nothing(procs: Procs, user_jobwrap: str) -> None:
    burner = procs.python(BURN)
    torchrun = procs.python(SLEEP, argv0="torchrun")
    config, state, log = write_config(
        procs, cpu_share=0.01, cpu_actions=("terminate",), ai_actions=("terminate",),
        kill_grace=0.0)
    _, out, _ = run_guard(procs, user_jobwrap, config, "--once", "--dry-run")
    assert "dry run: none taken" in out
    acted = [e for e in events(log) if e["event"] == "login_guard.action"]
    assert {(e["action"], e["rule"]) for e in acted} == {("terminate", "cpu"),
                                                         ("terminate", "ai")}
    assert all(e["dry_run"] and e["detail"].startswith("would") for e in acted)
    assert not wait_until(lambda: burner.poll() is not None or torchrun.poll() is not None,
                          timeout=1.0)
    assert list(state.iterdir()) == []  # no state, no lock: nothing a real run would trust


def test_status_shows_offenders_and_actions(tmp_path: Path) -> None:
    state = GuardState()
    violation = Violation(1500, "alice", "cpu", "cpu", since=1_800_000_000.0,
                          last_seen=1_800_000_300.0, seen="alice used 12 cores", stage=2,
                          stage_at=1_800_000_240.0, last_action="throttle")
    state.violations[violation.key] = violation
    state.record(ActionRecord(1_800_000_120.0, "warn", "alice", 1500, "cpu", (77,),
                              "alice used 12 cores", "message written to 1 of 1 terminal(s)",
                              False, True))
    state.record(ActionRecord(1_800_000_240.0, "throttle", "alice", 1500, "cpu", (77, 78),
                              "alice used 12 cores", "reniced [77, 78] to 19", False, False))
    StateStore(tmp_path / "login-guard").save(state)
    config = tmp_path / "c.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path}"\n')
    res = subprocess.run([JOBWRAP, "--config", str(config), "login-guard", "status"],
                         capture_output=True, text=True, check=True)
    lines = res.stdout.splitlines()
    assert "offenders (1):" in lines
    [row] = [ln for ln in lines if ln.strip().startswith("alice")
             and "alice used 12 cores" in ln and "1500" in ln]
    assert " throttle " in row and " cpu " in row
    assert any("throttle FAILED" in ln and "77,78" in ln for ln in lines)
    assert any(" warn " in ln and "message written" in ln for ln in lines)


def test_status_without_state_says_so(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path}"\n')
    res = subprocess.run([JOBWRAP, "--config", str(config), "login-guard", "status"],
                         capture_output=True, text=True, check=True)
    assert "no state yet" in res.stderr and "offenders (0):" in res.stdout


def test_a_bad_guard_setting_is_exit_2_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f'[paths]\nstate_dir = "{tmp_path}"\n[log]\nfile = ""\n'
                      '[login_guard]\ncpu_actions = ["warn", "shout"]\n')
    res = subprocess.run([JOBWRAP, "--config", str(config), "login-guard", "--once"],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 2
    assert f"invalid configuration in {config}" in res.stderr
    assert "[login_guard] cpu_actions" in res.stderr and "Traceback" not in res.stderr


def test_the_service_runs_until_sigterm_and_holds_the_node_lock(procs: Procs,
                                                                user_jobwrap: str) -> None:
    torchrun = procs.python(SLEEP, argv0="torchrun")
    config, state, log = write_config(procs, interval=0.2, ai_actions=("warn",))
    service = procs.start([user_jobwrap, "--config", str(config), "login-guard"])
    assert wait_until(lambda: any(e["event"] == "login_guard.action" for e in events(log)),
                      timeout=30)
    # A second guard on the node refuses to run beside it.
    second = subprocess.run([user_jobwrap, "--config", str(config), "login-guard", "--once"],
                            capture_output=True, text=True, check=False, user=TEST_USER)
    assert second.returncode == 2 and "another login guard" in second.stderr
    service.send_signal(signal.SIGTERM)
    assert service.wait(timeout=30) == 0
    names = [e["event"] for e in events(log)]
    assert names[0] == "login_guard.started" and names[-1] == "login_guard.stopped"
    assert torchrun.poll() is None  # warned only
    assert (state / "login-guard" / "state.json").exists()
