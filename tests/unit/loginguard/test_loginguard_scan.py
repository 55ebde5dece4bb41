"""The scanner against real processes: stat lines, kept-open files, execs, renamed programs."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.fixtures.loginguard.procs import (
    BURN,
    SLEEP,
    TEST_USER,
    Procs,
    procs_fixture,
    wait_until,
)
from wrapper.config import LoginGuardConfig
from wrapper.loginguard.rules import Policy
from wrapper.loginguard.scan import Scanner, Stat, StatFiles, parse_stat


@pytest.fixture
def procs() -> Iterator[Procs]:
    yield from procs_fixture()


def scanner(procs: Procs, **settings: object) -> Scanner:
    return Scanner(Policy.from_config(LoginGuardConfig(**settings), "test"), scope=procs.pids)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"42 (python3) R 1 42 42 0 -1 4194304 10 0 0 0 250 50 0 0 20 0 1 0 9000 1 2048 "
         b"18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n",
         Stat("python3", "R", 1, 9000, 300, 0, 2048)),
        # A name may hold spaces and parentheses: only the last ')' ends it.
        (b"7 (evil) (x y) S 1 7 7 0 -1 0 0 0 0 0 3 4 5 6 20 0 1 0 77 1 5 0 0 0\n",
         Stat("evil) (x y", "S", 1, 77, 7, 11, 5)),
        (b"7 (cut) S 1 2 3\n", None),
        (b"garbage", None),
    ],
)
def test_parse_stat(line: bytes, expected: Stat | None) -> None:
    assert parse_stat(line) == expected


def test_a_kept_file_reads_nothing_once_its_process_ends(procs: Procs) -> None:
    proc = procs.python(SLEEP)
    files = StatFiles()
    first = files.read(proc.pid)
    assert first is not None and parse_stat(first) is not None
    assert len(files) == 1
    again = files.read(proc.pid)
    first_stat, again_stat = parse_stat(first), parse_stat(again or b"")
    assert first_stat and again_stat and again_stat.start == first_stat.start
    proc.kill()
    proc.wait()
    assert files.read(proc.pid) is None and len(files) == 0  # closed, not read stale
    files.close()


def test_stat_files_beyond_the_limit_are_read_and_closed(procs: Procs) -> None:
    proc = procs.python(SLEEP)
    files = StatFiles(limit=0)
    assert files.read(proc.pid) is not None and len(files) == 0
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        files.read(proc.pid)
    assert len(os.listdir("/proc/self/fd")) == fds


def test_an_exec_is_seen_and_judged_again(procs: Procs) -> None:
    torchrun = procs.named("torchrun", shutil.which("sleep") or "/bin/sleep")
    gate = procs.shared / "go"
    shell = procs.start(["bash", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done; "
                                       f"exec {torchrun} 300"])
    scan = scanner(procs)
    [before] = [s for s in scan.scan().samples if s.pid == shell.pid]
    assert before.name == "bash" and before.signature == "" and before.session
    gate.touch()
    assert wait_until(lambda: psutil.Process(shell.pid).name() == "torchrun")
    [after] = [s for s in scan.scan().samples if s.pid == shell.pid]
    assert after.name == "torchrun" and after.signature == "torchrun" and not after.session
    assert after.create_time == pytest.approx(psutil.Process(shell.pid).create_time(), abs=0.01)


def test_cpu_is_measured_between_scans_including_new_processes(procs: Procs) -> None:
    idle = procs.python(SLEEP)
    scan = scanner(procs)
    first = scan.scan()
    assert not first.measured and all(s.cpu_cores == 0 for s in first.samples)
    burner = procs.python(BURN)  # starts after the first scan: all its CPU counts
    time.sleep(0.5)
    second = scan.scan()
    cores = {s.pid: s.cpu_cores for s in second.samples}
    assert second.measured and 0.3 < second.seconds < 5
    assert cores[burner.pid] > 0.05 and cores[idle.pid] < 0.05
    assert {s.user for s in second.samples} == {TEST_USER}


def test_a_renamed_interpreter_is_still_checked_for_ai_libraries(procs: Procs) -> None:
    library = procs.shared / "libtorch_cuda.so"
    shutil.copy("/usr/lib/x86_64-linux-gnu/libz.so.1"
                if os.path.exists("/usr/lib/x86_64-linux-gnu/libz.so.1")
                else "/lib/x86_64-linux-gnu/libz.so.1", library)
    library.chmod(0o755)
    disguised = procs.start([str(procs.named("cc1plus", "/usr/bin/python3")), "-c",
                             f"import ctypes, time\nctypes.CDLL({str(library)!r})\n"
                             "time.sleep(300)"])
    assert wait_until(lambda: str(library) in Path(f"/proc/{disguised.pid}/maps").read_text())
    [sample] = [s for s in scanner(procs).scan().samples if s.pid == disguised.pid]
    assert sample.name == "cc1plus" and sample.ai_library == "libtorch_cuda.so"


def test_ignored_accounts_are_not_sampled(procs: Procs) -> None:
    mine = procs.python(SLEEP)
    root = procs.python(SLEEP, user=None)
    pids = {s.pid for s in scanner(procs).scan().samples}
    assert mine.pid in pids and root.pid not in pids
    assert {s.pid for s in scanner(procs, exempt_users=(TEST_USER,)).scan().samples} == set()
    os.kill(root.pid, signal.SIGKILL)
    root.wait()


def test_short_lived_children_count_for_their_parent(procs: Procs) -> None:
    # Each child burns 0.2 s and is waited for; no scan sees most of them alive.
    parent = procs.python(
        "import subprocess, sys\n"
        "code = 'import time\\nt = time.time()\\nwhile time.time() - t < 0.2: pass'\n"
        "while True: subprocess.run([sys.executable, '-c', code])")
    scan = scanner(procs)
    scan.scan()
    time.sleep(1.5)
    [sample] = [s for s in scan.scan().samples if s.pid == parent.pid]
    assert sample.cpu_cores < 0.2 and sample.children_cores > 0.3
