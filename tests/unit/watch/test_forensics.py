"""Hang forensics: which processes are the job's ranks, their real stacks through py-spy,
which rank stands apart, and the supervisor waiting for them before it ends the job."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from wrapper.job.facts import FactChannel, fact
from wrapper.job.state import JobState
from wrapper.watch import forensics as fx
from wrapper.watch.procs import dump_stacks

STUCK = """
import sys, time
def stuck_in_here():
    print("ready", flush=True)
    time.sleep(60)
stuck_in_here()
"""


@pytest.fixture
def stuck() -> Iterator[subprocess.Popen[str]]:
    """A Python process of ours, in the job 4242, sleeping inside ``stuck_in_here``."""
    env = {**os.environ, "SLURM_JOB_ID": "4242", "RANK": "3"}
    proc = subprocess.Popen([sys.executable, "-c", STUCK], env=env, text=True,
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    time.sleep(0.3)  # py-spy needs the interpreter fully up
    yield proc
    proc.kill()
    proc.wait()


def rank(sig: str, inside: bool, pid: int = 1) -> dict[str, object]:
    return {"node": "n1", "pid": pid, "rank": None, "signature": sig, "in_collective": inside}


def test_the_rank_outside_the_collective_stands_apart() -> None:
    ranks = [rank("all_reduce (c10d.py:10)", True, 1), rank("main (train.py:38)", False, 2)]
    odd, why = fx.odd_ones(ranks)
    assert [r["pid"] for r in odd] == [2] and "1 of 2 ranks wait inside a collective" in why


def test_off_the_majority_stands_apart_and_no_difference_names_none() -> None:
    same = [rank("step (train.py:5)", False, p) for p in (1, 2, 3)]
    odd, _ = fx.odd_ones([*same, rank("load (data.py:9)", False, 4)])
    assert [r["pid"] for r in odd] == [4]
    assert fx.odd_ones(same)[0] == []
    assert fx.odd_ones(same[:1])[0] == []  # nothing to compare
    assert fx.odd_ones([rank("a (x:1)", False, 1), rank("b (x:2)", False, 2)])[0] == []


def test_the_jobs_processes_are_found_by_uid_and_job_id(stuck: subprocess.Popen[str]) -> None:
    mine = fx.job_processes("4242", os.getuid())
    assert [(p["pid"], p["rank"], p["label"]) for p in mine] == [(stuck.pid, "3", "RANK=3")]
    assert mine[0]["argv"].split(b"\0")[:2] == [sys.executable.encode(), b"-c"]
    assert fx.job_processes("4242", os.getuid() + 4321) == []  # someone else's uid
    assert fx.job_processes("424", os.getuid()) == []  # a prefix is not the job id


def test_a_real_stack_is_read_and_summarised(stuck: subprocess.Popen[str]) -> None:
    got = dump_stacks(fx.py_spy(), [stuck.pid], 10.0)[str(stuck.pid)]
    assert "threads" in got, got
    summary = fx.summarise(got["threads"], stuck.pid)
    assert summary["signature"].startswith("stuck_in_here (<string>:5)"), summary
    assert summary["in_collective"] is False


def test_collect_names_this_node_and_reads_no_gpu_it_was_not_given(
        stuck: subprocess.Popen[str]) -> None:
    from wrapper import config

    cfg = config.load(None)
    found = fx.collect(cfg, job_id="4242", node="n1", attempt=0, uid=os.getuid(),
                       gid=os.getgid(), gpus=[], budget=15.0)
    assert [(r["pid"], r["rank"]) for r in found["ranks"]] == [(stuck.pid, "3")]
    assert found["ranks"][0]["signature"].startswith("stuck_in_here"), found
    assert found["gpus"] == [] or "error" in found["gpus"][0]


def test_a_process_that_is_not_python_costs_one_error_not_the_others(
        stuck: subprocess.Popen[str]) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.2)
        got = dump_stacks(fx.py_spy(), [sleeper.pid, stuck.pid], 10.0)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert "error" in got[str(sleeper.pid)] and "threads" in got[str(stuck.pid)], got


def test_the_watcher_is_asked_once_by_the_supervisors_hang_fact(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("the fact channel is root's: this test runs as root (CI does)")
    state = JobState(tmp_path, "55")
    state.prepare(None, None)
    trigger = fx.Trigger(state, attempt=1)
    assert not trigger.wanted()
    channel = FactChannel.open(state)
    assert channel is not None
    channel.write(fact("hang", 0, idle_s=5))  # an earlier attempt's
    assert not trigger.wanted()
    channel.write(fact("hang", 1, idle_s=5))
    assert trigger.wanted() and not trigger.wanted()
    channel.close()


def test_rank_labels_are_bounded() -> None:
    from wrapper.watch.procs import LABEL_MAX, rank_label

    assert rank_label(b"3") == "3"
    assert len(rank_label(b"R" * 131000)) <= LABEL_MAX + 5
    assert "\n" not in rank_label(b"1\n\x1b[2Jfake")
