"""A node's samples of real processes (py-spy reading their stacks), judged, and carried
over a real pulse to the hub. Short clocks here; tests/e2e/test_pulse_hangs.py runs real
torch ranks under Slurm at the defaults."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from wrapper.pulse import Settings, munge
from wrapper.pulse.beat import Beater
from wrapper.pulse.hub import Hub
from wrapper.pulse.judge import HangJudge
from wrapper.watch.ranks import NodeSampler

JOB = "515151"
WAITS = "import time\ndef barrier():\n    time.sleep(600)\nbarrier()\n"  # named as a collective
SLEEPS = "import time\ntime.sleep(600)\n"
BUSY = "import time\nx = 0\nwhile True:\n    x += 1\n"


@pytest.fixture
def ranks() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def start(started: list[subprocess.Popen[bytes]], code: str, rank: int) -> int:
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": JOB, "RANK": str(rank)}
    started.append(subprocess.Popen([sys.executable, "-c", code], env=env))
    return started[-1].pid


def judge_for(sampler: NodeSampler, seconds: float) -> tuple[list[object], list[dict]]:
    judge = HangJudge(floor=1.0, k=2.0, interval=0.25)
    verdicts, last = [], {}
    end = time.monotonic() + seconds
    while time.monotonic() < end and not verdicts:
        last = sampler.sample(budget=2.0)
        v = judge.round(time.monotonic(), {"n1": (time.monotonic(), last)}, ["n1"])
        if v is not None:
            verdicts.append(v)
        time.sleep(0.25)
    return verdicts, last.get("ranks", [])


def settle(sampler: NodeSampler, count: int) -> None:
    """Until py-spy reads ``count`` ranks' stacks (the interpreters are up)."""
    end = time.monotonic() + 20
    while time.monotonic() < end:
        got = sampler.sample(budget=2.0)["ranks"]
        if len([r for r in got if "sig" in r]) == count:
            return
        time.sleep(0.2)
    raise AssertionError(f"the stacks were never read: {got}")


def test_the_sleeping_rank_is_named_and_the_waiting_one_is_seen_waiting(
        ranks: list[subprocess.Popen[bytes]]) -> None:
    waiting, sleeping = start(ranks, WAITS, 0), start(ranks, SLEEPS, 1)
    sampler = NodeSampler(job_id=JOB, node="n1", uid=os.getuid(), gid=os.getgid())
    settle(sampler, 2)
    verdicts, seen = judge_for(sampler, 8.0)
    by_pid = {r["pid"]: r for r in seen}
    assert by_pid[waiting]["coll"] is True and by_pid[sleeping]["coll"] is False
    assert by_pid[waiting]["rank"] == "0" and "barrier" in by_pid[waiting]["at"]
    assert len(verdicts) == 1
    assert [s["pid"] for s in verdicts[0].stuck] == [sleeping]  # type: ignore[attr-defined]
    assert sampler.spent > 0  # py-spy's cost is counted


def test_a_busy_rank_keeps_the_waiting_one_from_being_a_hang(
        ranks: list[subprocess.Popen[bytes]]) -> None:
    start(ranks, WAITS, 0)
    start(ranks, BUSY, 1)
    sampler = NodeSampler(job_id=JOB, node="n1", uid=os.getuid(), gid=os.getgid())
    settle(sampler, 2)
    verdicts, seen = judge_for(sampler, 3.0)  # 3 x the floor
    assert verdicts == [] and len(seen) == 2


def test_another_nodes_or_another_jobs_processes_are_not_sampled(
        ranks: list[subprocess.Popen[bytes]]) -> None:
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": JOB, "SLURMD_NODENAME": "n2", "RANK": "5"}
    ranks.append(subprocess.Popen([sys.executable, "-c", SLEEPS], env=env))
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": JOB + "0", "RANK": "6"}
    ranks.append(subprocess.Popen([sys.executable, "-c", SLEEPS], env=env))
    time.sleep(0.5)
    assert NodeSampler(job_id=JOB, node="n1", uid=os.getuid(),
                       gid=os.getgid()).sample(budget=2.0)["ranks"] == []


def test_a_nodes_sample_rides_its_beat_to_the_hub() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = Settings(interval=0.1, lost_after=0.8, fence_grace=0.3, ports=(port, port))
    heard: list[tuple[str, dict]] = []
    hub = Hub(job_id="88", attempt=0, node="n1", nodes=["n1", "n2"], settings=settings,
              signer=munge, uid=os.geteuid(),
              on_sample=lambda node, payload: heard.append((node, json.loads(payload))),
              on_lost=lambda node, silent: None)
    assert hub.bind("127.0.0.1") == port
    sent = [json.dumps({"node": "n2", "ranks": [{"pid": 1, "pad": "x" * 20000}]}).encode()]
    beater = Beater(job_id="88", attempt=0, node="n2", hub_host="127.0.0.1", settings=settings,
                    signer=munge, uid=os.geteuid(), on_fence=lambda *a: None,
                    sample=lambda: sent.pop() if sent else None)
    stop = threading.Event()
    threads = [threading.Thread(target=hub.run, args=(stop.is_set,)),
               threading.Thread(target=beater.run, args=(stop.is_set,))]
    for t in threads:
        t.start()
    try:
        end = time.monotonic() + 10
        while not heard and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(0.5)  # beats go on after the (large) sample
        assert [(n, len(s["ranks"][0]["pad"])) for n, s in heard] == [("n2", 20000)]
        assert "n2" in hub.seen and not hub.lost
    finally:
        stop.set()
        for t in threads:
            with contextlib.suppress(RuntimeError):
                t.join(timeout=5)
