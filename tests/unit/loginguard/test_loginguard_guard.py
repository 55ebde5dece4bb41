"""The guard against real processes run by a non-root test user, with a clock the test moves.

Each guard here is confined (``scope``) to the processes its test started, and every one
of those is killed by pid when the test ends.
"""

from __future__ import annotations

import os
import pwd
import select
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from structlog.testing import capture_logs

from tests.fixtures.loginguard.procs import (
    BURN,
    BURN_IGNORING_TERM,
    FIXTURES,
    SLEEP,
    TEST_USER,
    Clock,
    Procs,
    guard_config,
    procs_fixture,
    wait_until,
)
from wrapper.loginguard.gpu import TomlGpuPids
from wrapper.loginguard.guard import CycleReport, Guard
from wrapper.loginguard.state import StateStore

# Real time between two scans, so that a burner's CPU share is measured, not guessed.
SAMPLE = 0.4
# A CPU share a lone burner exceeds even on a machine loaded by other work: 2% of the
# node is 0.04 of a core on two cores, a fortieth of what it takes when it runs alone.
BUSY = 0.02


@pytest.fixture
def procs() -> Iterator[Procs]:
    yield from procs_fixture()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make_guard(tmp_path: Path, procs: Procs, clock: Callable[[], float], *,
               dry_run: bool = False, gpu_pids: Any = None, **settings: Any) -> Guard:
    # The CPU rule only where a test is about it: a process still starting up is busy.
    config = guard_config(tmp_path / "state", **{"cpu_share": 1.0, **settings})
    return Guard(config, dry_run=dry_run, clock=clock, scope=procs.pids,
                 gpu_pids=gpu_pids if gpu_pids is not None else set)


def step(guard: Guard, clock: Clock, seconds: float) -> CycleReport:
    time.sleep(SAMPLE)
    clock.advance(seconds)
    return guard.cycle()


def actions(logs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["action"], e["rule"]) for e in logs if e["event"] == "login_guard.action"]


def running(proc: Any) -> bool:
    return bool(proc.poll() is None)


def read_terminal(master: int, timeout: float = 2.0) -> str:
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            out += os.read(master, 65536)
        elif out:
            break
    return out.decode(errors="replace")


def test_a_burner_is_warned_then_throttled_then_killed(tmp_path: Path, procs: Procs,
                                                      clock: Clock) -> None:
    master, slave = os.openpty()
    os.chown(os.ttyname(slave), pwd.getpwnam(TEST_USER).pw_uid, -1)
    # A terminal of the user's, as an ssh session gives: the warning must reach it.
    burner = procs.start(["setsid", "-c", "python3", "-c", BURN_IGNORING_TERM],
                         executable="setsid", stdin=slave)
    guard = make_guard(tmp_path, procs, clock, cpu_share=BUSY, cpu_window=10.0,
                       escalate_after=10.0, kill_grace=5.0, forgive_after=600.0)
    with capture_logs() as logs:
        guard.cycle()  # the first scan has nothing to compare CPU times with
        first = step(guard, clock, 5)  # seen: the clock starts, the window has not passed
        assert [f.rule for f in first.findings] == ["cpu"] and first.actions == ()
        warned = step(guard, clock, 10)
        assert [a.action for a in warned.actions] == ["warn"]
        text = read_terminal(master)
        assert "sustained CPU use (cpu)" in text and "This is a warning." in text
        assert "sbatch" in text and "throttled" in text  # what comes next, where to go
        assert psutil.Process(burner.pid).nice() == 0
        throttled = step(guard, clock, 10)
        assert [a.action for a in throttled.actions] == ["throttle"]
        assert psutil.Process(burner.pid).nice() == 19
        assert "now throttled" in read_terminal(master)
        # Niced, the burner gets little CPU while other work loads the machine and may go
        # unseen for a scan; the clock goes on meanwhile, so termination still comes.
        for _ in range(20):
            terminated = step(guard, clock, 10)
            if terminated.actions:
                break
        assert [a.action for a in terminated.actions] == ["terminate"]
        assert running(burner)  # it ignores SIGTERM ...
        step(guard, clock, 5)  # ... so SIGKILL follows after the grace
        assert burner.wait(timeout=10) == -signal.SIGKILL
    assert actions(logs) == [("warn", "cpu"), ("throttle", "cpu"), ("terminate", "cpu"),
                             ("kill", "cpu")]
    for event in (e for e in logs if e["event"] == "login_guard.action"):
        assert event["user"] == TEST_USER and event["pids"] == (burner.pid,)
        assert event["dry_run"] is False and event["ok"] is True
    state, _ = StateStore(tmp_path / "state" / "login-guard").load()
    assert [a.action for a in state.history] == ["warn", "throttle", "terminate", "kill"]
    os.close(master)
    os.close(slave)


def test_throttle_writes_cpu_max_of_the_users_slice_and_lifts_it(tmp_path: Path, procs: Procs,
                                                                clock: Clock) -> None:
    uid = pwd.getpwnam(TEST_USER).pw_uid
    cgroup = tmp_path / "cgroup"
    cpu_max = cgroup / "user.slice" / f"user-{uid}.slice" / "cpu.max"
    cpu_max.parent.mkdir(parents=True)
    cpu_max.write_text("max 100000\n")
    burner = procs.python(BURN)
    guard = make_guard(tmp_path, procs, clock, cpu_share=BUSY, cpu_actions=("throttle",),
                       throttle_cpu_share=0.25, cgroup_root=str(cgroup), forgive_after=30.0)
    with capture_logs() as logs:
        guard.cycle()
        step(guard, clock, 5)
        quota = int(0.25 * guard.scanner.cpus * 100_000)
        assert cpu_max.read_text() == f"{quota} 100000\n"
        assert psutil.Process(burner.pid).nice() == 0  # the slice is capped, not the process
        burner.kill()
        burner.wait()
        step(guard, clock, 10)
        assert cpu_max.read_text() == f"{quota} 100000\n"  # not forgiven yet
        step(guard, clock, 30)
        assert cpu_max.read_text() == "max 100000\n"
    assert [a for a, _ in actions(logs)] == ["throttle", "unthrottle"]
    assert [e["event"] for e in logs if e["event"] == "login_guard.cleared"]


@pytest.mark.parametrize("how", ["renamed binary", "argv0", "accelerate launch", "cuda library"])
def test_ai_workloads_are_flagged(tmp_path: Path, procs: Procs, clock: Clock, how: str) -> None:
    if how == "renamed binary":  # a copy or link of a binary, named torchrun
        ai = procs.start([str(procs.named("torchrun", shutil.which("sleep") or "/bin/sleep")),
                          "300"])
    elif how == "argv0":
        ai = procs.python(SLEEP, argv0="torchrun")
    elif how == "accelerate launch":
        script = procs.shared / "accelerate"
        script.write_text(SLEEP)
        ai = procs.start(["python3", str(script), "launch", "train.py"])
    else:  # a Python process with a CUDA runtime mapped in
        library = procs.shared / "libcudart.so.12"
        shutil.copy(_any_shared_library(), library)
        library.chmod(0o755)
        ai = procs.python(f"import ctypes, time\nctypes.CDLL({str(library)!r})\ntime.sleep(300)")
        assert wait_until(lambda: "libcudart.so.12" in _maps(ai.pid))
    innocent = procs.python(SLEEP)
    guard = make_guard(tmp_path, procs, clock, ai_actions=("warn", "terminate"),
                       kill_grace=0.0)
    with capture_logs() as logs:
        report = guard.cycle()
    [finding] = report.findings
    assert finding.rule == "ai" and finding.user == TEST_USER
    assert [t.pid for t in finding.targets] == [ai.pid]
    assert ("libcudart.so.12 loaded" if how == "cuda library" else "runs ") in finding.seen
    assert actions(logs) == [("warn", "ai")]
    clock.advance(10)
    guard.cycle()
    assert ai.wait(timeout=10) in (-signal.SIGTERM, -signal.SIGKILL)
    assert running(innocent)


def test_a_process_on_a_gpu_is_flagged(tmp_path: Path, procs: Procs, clock: Clock) -> None:
    on_gpu = procs.python(SLEEP)
    other = procs.python(SLEEP)
    inventory = tmp_path / "gpus.toml"
    inventory.write_text((FIXTURES / "gpus.toml").read_text())
    guard = make_guard(tmp_path, procs, clock, gpu_actions=("warn",),
                       gpu_pids=TomlGpuPids(inventory))
    assert guard.cycle().findings == ()
    fixture = (FIXTURES / "gpus.toml").read_text()
    inventory.write_text(fixture.replace("index = 1\nuuid = \"GPU-00000000-fake-0000-0000-"
                                         "000000000001\"\nprocesses = []",
                                         "index = 1\nuuid = \"GPU-00000000-fake-0000-0000-"
                                         f"000000000001\"\nprocesses = [{on_gpu.pid}]"))
    with capture_logs() as logs:
        report = step(guard, clock, 5)
    [finding] = report.findings
    assert finding.rule == "gpu" and [t.pid for t in finding.targets] == [on_gpu.pid]
    assert "use a GPU of this login node" in finding.seen
    assert actions(logs) == [("warn", "gpu")]
    assert running(on_gpu) and running(other)


def test_a_gpu_probe_without_an_answer_is_logged_and_forgives_nothing(
        tmp_path: Path, procs: Procs, clock: Clock) -> None:
    on_gpu = procs.python(SLEEP)
    inventory = tmp_path / "gpus.toml"
    inventory.write_text(f"[[gpu]]\nindex = 0\nprocesses = [{on_gpu.pid}]\n")
    guard = make_guard(tmp_path, procs, clock, gpu_actions=("warn",), forgive_after=10.0,
                       gpu_pids=TomlGpuPids(inventory))
    guard.cycle()
    inventory.write_text("[[gpu]\n")  # broken
    with capture_logs() as logs:
        clock.advance(60)
        guard.cycle()
    events = [e for e in logs if e["event"] != "login_guard.cycle"]
    assert [e["event"] for e in events] == ["login_guard.gpu_probe_failed"]
    assert "cannot read the GPU pid file" in events[0]["error"]
    assert [v.rule for v in guard.state.violations.values()] == ["gpu"]


def test_memory_above_the_cap_is_flagged(tmp_path: Path, procs: Procs, clock: Clock) -> None:
    hog = procs.python("import time\nb = b'x' * (96 << 20)\ntime.sleep(300)")
    small = procs.python(SLEEP)
    assert wait_until(lambda: psutil.Process(hog.pid).memory_info().rss > 90 << 20)
    guard = make_guard(tmp_path, procs, clock, memory_gib=0.05, memory_actions=("warn",))
    [finding] = guard.cycle().findings
    assert finding.rule == "memory" and [t.pid for t in finding.targets] == [hog.pid]
    assert running(small)


def test_exempt_users_and_groups_and_root_are_left_alone(tmp_path: Path, procs: Procs,
                                                         clock: Clock) -> None:
    mine = procs.python(BURN_IGNORING_TERM)
    root_burner = procs.python(BURN, user=None)
    root_torchrun = procs.python(SLEEP, user=None, argv0="torchrun")
    harsh = {"cpu_share": 0.01, "cpu_actions": ("terminate",), "ai_actions": ("terminate",),
             "memory_gib": 0.001, "memory_actions": ("terminate",), "kill_grace": 0.0}
    for exemption in ({"exempt_users": (TEST_USER,)}, {"exempt_groups": (TEST_USER,)}):
        guard = make_guard(tmp_path / str(len(exemption)), procs, clock, **harsh, **exemption)
        with capture_logs() as logs:
            guard.cycle()
            report = step(guard, clock, 10)
            step(guard, clock, 10)
        assert report.findings == () and actions(logs) == []
        assert report.watched == 0
    # The same harsh guard without the exemption does act, on the test user only.
    guard = make_guard(tmp_path / "control", procs, clock, dry_run=True, **harsh)
    guard.cycle()
    report = step(guard, clock, 10)
    assert {f.user for f in report.findings} == {TEST_USER}
    assert {t.pid for f in report.findings for t in f.targets} == {mine.pid}
    assert running(mine) and running(root_burner) and running(root_torchrun)


def test_an_exempt_command_has_its_own_allowance(tmp_path: Path, procs: Procs,
                                                 clock: Clock) -> None:
    # /usr/bin/yes: a root file, busy for a core; exempt by what it runs, not its name.
    compiler = procs.start(["yes"])
    generous = make_guard(tmp_path / "a", procs, clock, cpu_share=0.05,
                          exempt_commands=("yes=0.95",), cpu_actions=("warn",))
    generous.cycle()
    assert step(generous, clock, 5).findings == ()
    strict = make_guard(tmp_path / "b", procs, clock, cpu_share=0.95,
                        exempt_commands=(f"yes={BUSY}",), cpu_actions=("warn",))
    strict.cycle()
    [finding] = step(strict, clock, 5).findings
    assert finding.rule == "cpu:yes" and [t.pid for t in finding.targets] == [compiler.pid]
    assert "your yes processes used" in finding.seen


def test_an_interpreter_named_like_an_exempt_command_gets_no_allowance(
        tmp_path: Path, procs: Procs, clock: Clock) -> None:
    disguised = procs.start([str(procs.named("yes", "/usr/bin/python3")), "-c", BURN])
    guard = make_guard(tmp_path, procs, clock, cpu_share=BUSY, exempt_commands=("yes=0.95",),
                       cpu_actions=("warn",))
    guard.cycle()
    [finding] = step(guard, clock, 5).findings
    assert finding.rule == "cpu" and [t.pid for t in finding.targets] == [disguised.pid]


def test_shells_and_sessions_are_never_killed(tmp_path: Path, procs: Procs,
                                             clock: Clock) -> None:
    shell = procs.start(["bash", "-c", "sleep 300; true"])
    # A system binary called sshd (root's, as /usr/sbin/sshd is).
    sshd = procs.start([str(procs.system_copy("sshd", "/bin/sleep")), "300"])
    # A user's disguise: a link named sshd to an interpreter it may run anything with.
    disguised = procs.start([str(procs.named("sshd", "/usr/bin/python3")), "-c", SLEEP])
    # Real shells, but one loads the user's code and one computes: no longer protected.
    preloaded = procs.start(["bash", "-c", "sleep 300; true"],
                            env={"LD_PRELOAD": str(user_library(procs)), "PATH": "/usr/bin"})
    busy = procs.start(["bash", "-c", "while :; do :; done"])
    # Every one matches an AI signature: only protection keeps it alive.
    guard = make_guard(tmp_path, procs, clock, cpu_share=1.0, ai_commands=("bash", "sshd"),
                       ai_actions=("terminate",), kill_grace=0.0)
    targets = (disguised, preloaded, busy)
    with capture_logs() as logs:
        guard.cycle()
        step(guard, clock, 5)
        # On a loaded machine a busy shell's CPU may show only in a later sample: step
        # until the three have been acted on (bounded), then once more with only the
        # protected ones left.
        for _ in range(6):
            step(guard, clock, 10)
            if not any(running(proc) for proc in targets):
                break
        for proc in targets:
            assert proc.wait(timeout=10) in (-signal.SIGTERM, -signal.SIGKILL)
        step(guard, clock, 10)
    assert running(shell) and running(sshd)
    killed = {p for e in logs if e["event"] == "login_guard.action" for p in e["pids"]}
    assert killed == {disguised.pid, preloaded.pid, busy.pid}
    # Once only protected processes are left, the step says so instead of killing them.
    last = [e for e in logs if e["event"] == "login_guard.action"][-1]
    assert "nothing to terminate" in last["detail"]


def user_library(procs: Procs) -> Path:
    """A harmless shared library in the user's own folder: code root did not put there."""
    library = procs.shared / "libmine.so"
    if not library.exists():
        shutil.copy(os.path.realpath(system_library()), library)
        library.chmod(0o755)
        os.chown(library, pwd.getpwnam(TEST_USER).pw_uid, -1)
    return library


def system_library() -> str:
    for path in ("/usr/lib/x86_64-linux-gnu/libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1",
                 "/usr/lib64/libz.so.1"):
        if os.path.exists(path):
            return path
    pytest.fail("no libz.so.1 to copy as a user's library")


def test_dry_run_acts_on_nothing_and_writes_no_state(tmp_path: Path, procs: Procs,
                                                     clock: Clock) -> None:
    uid = pwd.getpwnam(TEST_USER).pw_uid
    cgroup = tmp_path / "cgroup"
    cpu_max = cgroup / "user.slice" / f"user-{uid}.slice" / "cpu.max"
    cpu_max.parent.mkdir(parents=True)
    cpu_max.write_text("max 100000\n")
    master, slave = os.openpty()
    os.chown(os.ttyname(slave), uid, -1)
    burner = procs.start(["setsid", "-c", "python3", "-c", BURN_IGNORING_TERM],
                         executable="setsid", stdin=slave)
    torchrun = procs.python(SLEEP, argv0="torchrun")
    guard = make_guard(tmp_path, procs, clock, dry_run=True, cpu_share=0.01, kill_grace=0.0,
                       escalate_after=1.0, cgroup_root=str(cgroup))
    with capture_logs() as logs:
        guard.cycle()
        for _ in range(5):
            step(guard, clock, 5)
    steps = actions(logs)
    # Every step a real run would take, each only reported.
    assert [a for a, rule in steps if rule == "cpu"][:3] == ["warn", "throttle", "terminate"]
    ai_steps = [a for a, rule in steps if rule == "ai"]
    assert ai_steps[0] == "warn" and set(ai_steps[1:]) == {"terminate"}, logs
    assert all(e["dry_run"] for e in logs if e["event"] == "login_guard.action")
    assert all(e["detail"].startswith("would") for e in logs
               if e["event"] == "login_guard.action")
    assert running(burner) and running(torchrun)
    assert psutil.Process(burner.pid).nice() == 0
    assert cpu_max.read_text() == "max 100000\n"
    assert read_terminal(master, timeout=0.5) == ""
    assert not (tmp_path / "state").exists()
    os.close(master)
    os.close(slave)


def test_a_restart_keeps_the_violation_clock(tmp_path: Path, procs: Procs,
                                            clock: Clock) -> None:
    burner = procs.python(BURN_IGNORING_TERM)
    # No throttle step: a niced burner may go unseen on a loaded machine (see above).
    settings = {"cpu_share": BUSY, "cpu_window": 10.0, "escalate_after": 10.0,
                "kill_grace": 5.0, "cpu_actions": ("warn", "terminate")}
    first = make_guard(tmp_path, procs, clock, **settings)
    first.cycle()
    step(first, clock, 5)
    started = clock.now
    step(first, clock, 10)  # warned
    del first  # the guard stops (a crash, a restart by systemd)
    with capture_logs() as logs:
        second = make_guard(tmp_path, procs, clock, **settings)
        [violation] = second.state.violations.values()
        assert (violation.since, violation.stage, violation.last_action) == \
            (started, 1, "warn")
        second.cycle()  # no CPU baseline yet in this process: the clock is not forgiven
        step(second, clock, 10)  # the clock went on: terminate, not a fresh warning ...
    del second
    third = make_guard(tmp_path, procs, clock, **settings)
    assert [k.pid for k in third.state.pending_kills] == [burner.pid]
    assert running(burner)
    clock.advance(5)
    third.finish_kills(clock.now)  # ... and the SIGKILL a restart must not forget
    assert burner.wait(timeout=10) == -signal.SIGKILL
    assert actions(logs) == [("terminate", "cpu")]
    assert [v.since for v in third.state.violations.values()] == [started]


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


def _any_shared_library() -> str:
    for candidate in ("/usr/lib/x86_64-linux-gnu/libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1",
                      "/usr/lib/aarch64-linux-gnu/libz.so.1", "/usr/lib64/libz.so.1"):
        if os.path.exists(candidate):
            return candidate
    pytest.fail("no libz.so.1 to stand in for a CUDA library")


def test_the_notify_command_gets_every_step_with_its_message(tmp_path: Path, procs: Procs,
                                                             clock: Clock) -> None:
    procs.python(SLEEP, argv0="torchrun")
    out = tmp_path / "notified"
    record = ("import sys\nwith open(sys.argv[1], 'a') as f:\n"
              "    f.write(sys.argv[2] + '|' + sys.stdin.read() + '\\n')")
    guard = make_guard(tmp_path, procs, clock, ai_actions=("warn",), notify_command=(
        sys.executable, "-c", record, str(out), "{user}:{uid}:{rule}:{action}"))
    guard.cycle()
    text = out.read_text()
    uid = pwd.getpwnam(TEST_USER).pw_uid
    assert text.startswith(f"{TEST_USER}:{uid}:ai:warn|jobwrap login guard: {TEST_USER}")
    assert "runs torchrun" in text and "sbatch" in text


def test_a_failing_notify_command_is_logged_and_the_step_stands(tmp_path: Path, procs: Procs,
                                                                clock: Clock) -> None:
    procs.python(SLEEP, argv0="torchrun")
    guard = make_guard(tmp_path, procs, clock, ai_actions=("warn",),
                       notify_command=("false", "{user}"))
    with capture_logs() as logs:
        report = guard.cycle()
    [failed] = [e for e in logs if e["event"] == "login_guard.notify_failed"]
    assert "'false jwguard' failed with exit code 1" in failed["error"]
    assert [(a.action, a.ok) for a in report.actions] == [("warn", True)]


def test_the_loop_scans_every_interval_until_asked_to_stop(tmp_path: Path,
                                                           procs: Procs) -> None:
    torchrun = procs.python(SLEEP, argv0="torchrun")
    guard = make_guard(tmp_path, procs, time.time, interval=0.1, ai_actions=("warn",),
                       escalate_after=3600.0)
    loop = threading.Thread(target=guard.run_forever)
    with capture_logs() as logs:
        loop.start()
        assert wait_until(lambda: sum(e["event"] == "login_guard.cycle" for e in logs) >= 4)
        guard.request_stop()
        loop.join(timeout=10)
    assert not loop.is_alive()
    names = [e["event"] for e in logs]
    assert names[0] == "login_guard.started" and names[-1] == "login_guard.stopped"
    assert actions(logs) == [("warn", "ai")]  # once: the next step is an hour away
    assert running(torchrun)
    state, _ = StateStore(tmp_path / "state" / "login-guard").load()
    assert [v.rule for v in state.violations.values()] == ["ai"]


def test_the_window_must_be_sustained_but_a_pause_after_a_step_resets_nothing(
        tmp_path: Path, procs: Procs, clock: Clock) -> None:
    on_gpu = procs.python(SLEEP)
    inventory = tmp_path / "gpus.toml"
    listed = f"[[gpu]]\nindex = 0\nprocesses = [{on_gpu.pid}]\n"
    idle = "[[gpu]]\nindex = 0\nprocesses = []\n"
    guard = make_guard(tmp_path, procs, clock, ai_window=20.0, escalate_after=30.0,
                       forgive_after=60.0, gpu_actions=("warn", "terminate"),
                       gpu_pids=TomlGpuPids(inventory))
    start = clock.now

    def at(offset: float, text: str) -> list[str]:
        inventory.write_text(text)
        clock.now = start + offset
        return [a.action for a in guard.cycle().actions]

    assert at(0, listed) == [] and at(10, listed) == []
    assert at(15, idle) == []  # a pause inside the window: not sustained
    assert guard.state.violations == {}
    assert at(20, listed) == [] and at(35, listed) == []  # the window starts again at 20
    assert at(40, listed) == ["warn"]
    assert at(50, idle) == []  # after a step, a pause is not forgiveness ...
    [violation] = guard.state.violations.values()
    assert (violation.since, violation.stage) == (start + 20, 1)
    assert at(70, listed) == ["terminate"]  # ... the ladder goes on where it was
    assert on_gpu.wait(timeout=10) in (-signal.SIGTERM, -signal.SIGKILL)
