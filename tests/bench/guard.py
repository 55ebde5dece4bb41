"""guard-scan and guard-cpu: what the login guard costs on a busy login node.

Both run with 2,000 live, watched processes (cheap sleepers of a non-root user, killed
by pid afterwards). guard-scan: CPU milliseconds of one steady-state scan (the scan and
the rules, as each cycle runs them), alternated in the same run with a bare
``psutil.process_iter(["pid"])`` pass, the floor of any psutil scan; goal <= 100 ms.
guard-cpu: the real ``jobwrap login-guard`` (``--dry-run``, so that it touches nothing
on the machine) at the default interval, its CPU share over a 30 s window, beside a
bare Python loop doing that floor pass as often; goal < 0.5 % of one core.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from tests.bench.timing import alternate, verdict

POPULATION = 2000
WINDOW = 30.0
# The guard tests' own user: nothing else runs as it, so its sleepers are ours alone.
USER = "jwguard"


def _sleeper_user() -> str | None:
    """Whom the sleepers run as: a watched (non-root) user; None: as ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", USER], check=True)
    return USER


@contextlib.contextmanager
def sleepers(count: int) -> Iterator[list[int]]:
    user = _sleeper_user()
    started: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            started.append(subprocess.Popen(["sleep", "3600"], user=user, cwd="/",
                                            stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL))
        yield [p.pid for p in started]
    finally:
        for proc in started:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        for proc in started:
            proc.wait()


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def scan_main() -> int:
    from wrapper.config import LoginGuardConfig
    from wrapper.loginguard.rules import Policy, evaluate
    from wrapper.loginguard.scan import Scanner, raise_open_file_limit

    raise_open_file_limit()  # as `jobwrap login-guard` does
    policy = Policy.from_config(LoginGuardConfig(), "(defaults)")
    scanner = Scanner(policy)
    watched = 0

    def guard_scan() -> float:
        nonlocal watched
        started = time.process_time()
        snapshot = scanner.scan()
        evaluate(snapshot, policy, set())
        watched = len(snapshot.samples)
        return time.process_time() - started

    def floor() -> float:
        started = time.process_time()
        list(psutil.process_iter(["pid"]))
        return time.process_time() - started

    with sleepers(POPULATION):
        total = len(psutil.pids())
        first = guard_scan()
        subject, anchor = alternate(guard_scan, floor, rounds=15, warmup=2)
        kept_open = len(scanner.stat_files)
        scanner.close()
    print(f"guard scan over {total} processes ({watched} watched, {kept_open} stat files "
          f"kept open): median {subject * 1000:.1f} ms CPU, first scan {first * 1000:.1f} ms; "
          f"a bare process_iter(['pid']) pass {anchor * 1000:.1f} ms "
          f"({subject / anchor:.2f}x)")
    return verdict("guard-scan", "ms", subject * 1000, "<=", 100)


def cpu_main() -> int:
    from wrapper.config import LoginGuardConfig

    interval = LoginGuardConfig().interval
    jobwrap = Path(sys.executable).parent / "jobwrap"
    with tempfile.TemporaryDirectory() as tmp, sleepers(POPULATION):
        config = Path(tmp) / "config.toml"
        config.write_text(f'[paths]\nstate_dir = "{tmp}/state"\n'
                          f'[log]\nfile = "{tmp}/guard.log"\nlevel = "info"\n')
        guard = subprocess.Popen([str(jobwrap), "--config", str(config), "login-guard",
                                  "--dry-run"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        floor = subprocess.Popen([sys.executable, "-c",
                                  "import time, psutil\nwhile True:\n"
                                  "    list(psutil.process_iter(['pid']))\n"
                                  f"    time.sleep({interval})"])
        try:
            guard_proc, floor_proc = psutil.Process(guard.pid), psutil.Process(floor.pid)
            time.sleep(5)  # past start-up (imports, the first scan that fills the caches)
            g0, f0 = _cpu(guard_proc), _cpu(floor_proc)
            time.sleep(WINDOW)
            g1, f1 = _cpu(guard_proc), _cpu(floor_proc)
            alive = guard.poll() is None
        finally:
            for proc in (guard, floor):
                proc.terminate()
            for proc in (guard, floor):
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    if not alive:
        print("guard-cpu: the guard exited early", file=sys.stderr)
        return 1
    g = 100 * (g1 - g0) / WINDOW
    f = 100 * (f1 - f0) / WINDOW
    print(f"login guard {g:.3f} % of a core over {WINDOW:g} s at interval {interval:g} s "
          f"with {POPULATION} extra processes; a bare process_iter(['pid']) loop as often: "
          f"{f:.3f} %")
    return verdict("guard-cpu", "pct", g, "<", 0.5)
