"""Issue 12 item 12: an ordinary user evades the login guard.

Each test plays one evasion as the project's test user (``runuser``, no Slurm needed)
and runs the real ``jobwrap login-guard --once --dry-run`` as root over the whole node,
with limits small enough to trip in its one-second sample. A dry run touches no
process, so other users' work on this machine is safe; assertions name the pids started
here, so their work cannot make a test pass either. Every process started here is
killed by pid when its test ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from wrapper.config import Config, LogConfig, LoginGuardConfig, PathsConfig, to_toml
from wrapper.osl.users import UserIds

# Burners are judged over a one-second CPU sample: no other tier's burners beside them.
pytestmark = pytest.mark.exclusive

JOBWRAP = str(Path(sys.executable).parent / "jobwrap")
RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"
BURN = "while True: pass"
# One short burner after another: each lives about a fifth of a second, far less than
# a scan interval, so no scan sees one twice.
SHORT_BURNERS = """import subprocess, sys
burner = "import time\\nt = time.time()\\nwhile time.time() - t < 0.2: pass"
while True:
    subprocess.run([sys.executable, "-c", burner])
"""
BURN_SO = r"""
#include <pthread.h>
static void *burn(void *arg) { for (;;) __asm__ volatile(""); return arg; }
__attribute__((constructor)) static void start(void) {
    pthread_t thread;
    pthread_create(&thread, 0, burn, 0);
}
"""


class Attacker:
    """The test user's processes, each started with runuser; all killed by pid at the end."""

    def __init__(self, user: UserIds, home: Path) -> None:
        self.user, self.home = user, home
        self.runusers: list[subprocess.Popen[bytes]] = []

    def shell(self, script: str, *, env: dict[str, str] | None = None) -> int:
        """``script`` run by bash as the user; returns the pid it wrote (``echo $$``)."""
        pidfile = self.home / f"pid-{len(self.runusers)}"
        base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(self.home),
                "D": str(self.home), "LANG": "C.UTF-8"}
        proc = subprocess.Popen(
            [RUNUSER, "-u", self.user.name, "--", "bash", "-c",
             f"echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}; {script}"],
            env={**base, **(env or {})}, cwd=self.home, stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.runusers.append(proc)
        deadline = time.monotonic() + 20
        while not pidfile.exists():
            assert proc.poll() is None, f"the user's script ended early: {script}"
            assert time.monotonic() < deadline, f"the user's script never started: {script}"
            time.sleep(0.02)
        return int(pidfile.read_text())

    def write(self, name: str, text: str) -> Path:
        path = self.home / name
        path.write_text(text)
        os.chown(path, self.user.uid, self.user.gid)
        return path

    def as_user(self, argv: Sequence[str]) -> None:
        subprocess.run([RUNUSER, "-u", self.user.name, "--", *argv], cwd=self.home,
                       check=True, capture_output=True, timeout=60)

    def stop_all(self) -> None:
        for proc in self.runusers:
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in psutil.Process(proc.pid).children(recursive=True):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def attacker(user: UserIds, shared: Path) -> Iterator[Attacker]:
    home = shared / "attacker"
    home.mkdir()
    os.chown(home, user.uid, user.gid)
    attack = Attacker(user, home)
    try:
        yield attack
    finally:
        attack.stop_all()


def guard_once(shared: Path, **login_guard: Any) -> str:
    """``jobwrap login-guard --once --dry-run`` as root over the node: its report."""
    state = shared / "state"
    settings = {"cpu_window": 0.0, "memory_window": 0.0, "ai_window": 0.0,
                "cpu_actions": ("warn",), "ai_actions": ("warn",), "ai_commands": (),
                "cgroup_root": str(shared / "no-cgroup"), **login_guard}
    config = Config(paths=PathsConfig(state_dir=str(state)), log=LogConfig(file=""),
                    login_guard=LoginGuardConfig(**settings))
    path = shared / "guard.toml"
    path.write_text(to_toml(config))
    res = subprocess.run([JOBWRAP, "--config", str(path), "login-guard", "--once",
                          "--dry-run"], capture_output=True, text=True, timeout=120,
                         check=False, cwd="/")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    return res.stdout


def findings(report: str, user: str, rule: str) -> list[tuple[str, set[int]]]:
    """(what was seen, pids it may act on) of each finding of ``user`` under ``rule``."""
    lines = report.splitlines()
    found = []
    for i, line in enumerate(lines):
        if line.startswith(f"  {user} {rule}: "):
            targets = lines[i + 1].strip().removeprefix("may act on: ")
            pids = {int(p) for p in targets.split(", ") if p.isdigit()}
            found.append((line, pids))
    return found


def burning(pid: int) -> None:
    """Wait until ``pid`` runs what it was meant to (past its exec) and uses CPU."""
    proc = psutil.Process(pid)
    before = sum(proc.cpu_times()[:2])
    deadline = time.monotonic() + 20
    while sum(proc.cpu_times()[:2]) - before < 0.1:
        assert time.monotonic() < deadline, f"{pid} never got busy"
        time.sleep(0.05)


DISGUISES = {
    "symlink": 'ln -s /usr/bin/python3 "$D/make" && exec "$D/make" -c "{burn}"',
    "copy": 'cp /usr/bin/python3 "$D/make" && exec "$D/make" -c "{burn}"',
    "script": 'printf "#!/usr/bin/python3\\n{burn}\\n" > "$D/make" && chmod +x "$D/make" '
              '&& exec "$D/make"',
    "argv0": 'exec -a make python3 -c "{burn}"',
    "comm": 'exec python3 -c "open(\'/proc/self/comm\', \'w\').write(\'make\')\n{burn}"',
}


@pytest.mark.parametrize("how", sorted(DISGUISES))
def test_an_interpreter_disguised_as_make_gets_no_allowance(attacker: Attacker, shared: Path,
                                                            how: str) -> None:
    pid = attacker.shell(DISGUISES[how].format(burn=BURN))
    burning(pid)
    assert psutil.Process(pid).name() == "make" or how == "argv0"
    # make may use 90% of the node; anything else 5%.
    report = guard_once(shared, cpu_share=0.05, exempt_commands=("make=0.9",))
    general = findings(report, attacker.user.name, "cpu")
    assert any(pid in pids for _, pids in general), report
    assert not any(pid in pids for _, pids in findings(report, attacker.user.name,
                                                       "cpu:make")), report


def test_short_lived_burners_are_counted(attacker: Attacker, shared: Path) -> None:
    # A parent that starts one short burner after another: none lives to be sampled twice.
    script = attacker.write("short.py", SHORT_BURNERS)
    parent = attacker.shell(f'exec python3 "{script}"')
    time.sleep(1)
    report = guard_once(shared, cpu_share=0.05)
    general = findings(report, attacker.user.name, "cpu")
    assert any(parent in pids and "ended children" in seen for seen, pids in general), report


def test_a_shell_that_preloads_a_burner_is_not_protected(attacker: Attacker,
                                                         shared: Path) -> None:
    if shutil.which("cc") is None:
        pytest.fail("this test compiles burn.so with cc (gcc is in the dev packages)")
    attacker.write("burn.c", BURN_SO)
    attacker.as_user(["cc", "-shared", "-fPIC", "-o", str(attacker.home / "burn.so"),
                      str(attacker.home / "burn.c"), "-lpthread"])
    shell = attacker.shell("read -r -t 300 _",
                           env={"LD_PRELOAD": str(attacker.home / "burn.so")})
    burning(shell)
    assert psutil.Process(shell).name() == "bash"
    report = guard_once(shared, cpu_share=0.05)
    assert any(shell in pids for _, pids in findings(report, attacker.user.name, "cpu")), report


def test_a_shell_mapping_a_users_library_is_not_protected(attacker: Attacker,
                                                          shared: Path) -> None:
    # Not busy at all: only what it maps tells it from a login shell.
    library = attacker.home / "libmine.so"
    attacker.as_user(["cp", os.path.realpath(_libz()), str(library)])
    preloaded = attacker.shell("read -r -t 300 _", env={"LD_PRELOAD": str(library)})
    plain = attacker.shell("read -r -t 300 _")
    for pid in (preloaded, plain):
        deadline = time.monotonic() + 20
        while psutil.Process(pid).name() != "bash" or not _reading(pid):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    report = guard_once(shared, ai_commands=("bash",))
    [(_, pids)] = findings(report, attacker.user.name, "ai")  # both run bash
    assert preloaded in pids and plain not in pids, report


def _reading(pid: int) -> bool:
    return psutil.Process(pid).status() == psutil.STATUS_SLEEPING


def _libz() -> str:
    for path in ("/usr/lib/x86_64-linux-gnu/libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1",
                 "/usr/lib64/libz.so.1"):
        if os.path.exists(path):
            return path
    pytest.fail("no libz.so.1 to copy as a user's library")
