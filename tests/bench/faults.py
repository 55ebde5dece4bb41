"""Fault and hang benchmarks on the real local Slurm (root):

- fault-detect: an Xid written into the node's fake GPU inventory while a job runs ->
  the job no longer RUNNING, in seconds, against ``gpu_interval`` (goal: <= 2 x it);
  anchor, alternating: the same job ``scancel``'ed by hand -> no longer RUNNING (the floor
  of Slurm itself, and of this poll);
- hang-cadence: the supervisor's own rule (tests/bench/hangs.py is the pulse's
  hang-detect): a one-process job printing a line every few seconds, then stuck: its
  last line -> the job no longer RUNNING, as a multiple of the cadence the supervisor
  learned (the ``hang`` event's ``cadence_s``); goal: <= hang_k + 1. Anchor: the job's
  true cadence, from its own lines' timestamps;
- watch-cpu: a node watcher's CPU share (its scontrol children included) while it
  follows a running GPU job for a minute, against a bare Python loop waking as often.
"""

from __future__ import annotations

import itertools
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from jobwrap_dev.sandbox.cluster import Cluster
from tests.bench.cluster import sandbox
from tests.bench.timing import verdict
from wrapper import config
from wrapper.runner import Runner
from wrapper.watch.files import pid_file

SLEEPER = """#!/bin/bash
#SBATCH --nodes=1 --gres=gpu:1 --output={name}-%j.out
#JOBWRAP --max-restarts=0 --hang-timeout=off
for i in $(seq 1 600); do sleep 0.5; done
"""

HANGER = """#!/bin/bash
#SBATCH --nodes=1 --output=hang-%j.out
#JOBWRAP --max-restarts=0
python3 -c '
import time
for i in range({lines}):
    print("line", time.time(), flush=True)
    time.sleep({period})
time.sleep(100000)
'
"""
LINE = re.compile(r"^line ([\d.]+)$", re.M)


def _running_with_watcher(cluster: Cluster, job_id: str) -> str:
    """Wait until the job runs and its node's watcher has started; returns the node."""
    info = cluster.wait_job(job_id, states={"RUNNING"}, timeout=60)
    node = info["NodeList"]
    state = cluster.job_state(job_id, node)
    deadline = time.monotonic() + 30
    while state.read_json(pid_file(node)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job_id}: no watcher on {node} after 30 s")
        time.sleep(0.1)
    return node


def _seconds_until_not_running(cluster: Cluster, job_id: str, since: float,
                               limit: float = 120) -> float:
    while cluster.job(job_id).get("JobState") == "RUNNING":
        if time.monotonic() - since > limit:
            raise RuntimeError(f"job {job_id} still RUNNING after {limit:g} s")
        time.sleep(0.05)
    return time.monotonic() - since


def _scontrol(cluster: Cluster, *args: str) -> None:
    Runner(cluster.env()).run(["scontrol", *args], timeout=20, check=False)


def _xid_once(cluster: Cluster) -> float:
    job_id = cluster.submit(SLEEPER.format(name="xid"), name="xid.sh")
    node = _running_with_watcher(cluster, job_id)
    time.sleep(0.5)  # past the watcher's first reading: any phase of its cadence
    written = time.monotonic()
    cluster.set_gpu_faults(node, {m: {"xid_events": (79,)} for m in range(4)})
    try:
        return _seconds_until_not_running(cluster, job_id, written)
    finally:
        cluster.wait_job(job_id, timeout=120)
        cluster.set_gpu_faults(node)
        _scontrol(cluster, "update", f"NodeName={node}", "State=RESUME")


def _scancel_once(cluster: Cluster) -> float:
    job_id = cluster.submit(SLEEPER.format(name="cancel"), name="cancel.sh")
    _running_with_watcher(cluster, job_id)
    time.sleep(0.5)
    sent = time.monotonic()
    cluster.as_user(["scancel", job_id])
    try:
        return _seconds_until_not_running(cluster, job_id, sent)
    finally:
        cluster.wait_job(job_id, timeout=120)


def _alternate(subject: Callable[[], float], anchor: Callable[[], float],
               rounds: int) -> tuple[list[float], list[float]]:
    s, a = [], []
    for i in range(rounds):
        if i % 2 == 0:
            s.append(subject())
            a.append(anchor())
        else:
            a.append(anchor())
            s.append(subject())
    return s, a


def fault_detect_main(rounds: int = 6) -> int:
    with sandbox() as cluster:
        interval = config.load(str(cluster.jobwrap_config)).supervisor.gpu_interval
        subject, anchor = _alternate(lambda: _xid_once(cluster), lambda: _scancel_once(cluster),
                                     rounds)
    s, a = statistics.median(subject), statistics.median(anchor)
    print(f"Xid written -> job ended: median {s:.2f} s (max {max(subject):.2f}) of "
          f"{len(subject)}; scancel -> job ended: median {a:.2f} s; gpu_interval "
          f"{interval:g} s")
    return verdict("fault-detect", "x_gpu_interval", s / interval, "<=", 2)


def _hang_once(cluster: Cluster, lines: int, period: float) -> tuple[float, float, float]:
    """(last line -> ended, the learned cadence, the job's true cadence), seconds."""
    job_id = cluster.submit(HANGER.format(lines=lines, period=period), name="hang.sh")
    cluster.wait_job(job_id, states={"RUNNING"}, timeout=60)
    out = cluster.work / f"hang-{job_id}.out"
    deadline = time.monotonic() + lines * period + 30
    while len(LINE.findall(_text(out))) < lines:
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job_id} printed {_text(out)!r}")
        time.sleep(0.05)
    # The last line's own timestamp, in this clock (the job runs on this same host).
    stamps = [float(t) for t in LINE.findall(_text(out))]
    last_mono = time.monotonic() - (time.time() - stamps[-1])
    ended = _seconds_until_not_running(cluster, job_id, last_mono, limit=300)
    cluster.wait_job(job_id, timeout=120)
    hang = [e for e in cluster.events(job_id) if e["event"] == "hang"]
    if len(hang) != 1:
        raise RuntimeError(f"job {job_id}: hang events {hang}")
    true = statistics.median(b - a for a, b in itertools.pairwise(stamps))
    return ended, float(hang[0]["cadence_s"]), true


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def hang_detect_main(rounds: int = 3, lines: int = 4, period: float = 6.0) -> int:
    with sandbox() as cluster:
        text = cluster.jobwrap_config.read_text()
        # The sandbox's floors (40 s) would hide the cadence: floors under k x cadence.
        text = re.sub(r"(?m)^hang_floor = .*$", "hang_floor = 5", text)
        cluster.jobwrap_config.write_text(re.sub(r"(?m)^hang_min = .*$", "hang_min = 5", text))
        k = config.load(str(cluster.jobwrap_config)).supervisor.hang_k
        runs = [_hang_once(cluster, lines, period) for _ in range(rounds)]
    multiples = [ended / learned for ended, learned, _ in runs]
    m = statistics.median(multiples)
    shown = "; ".join(f"{e:.1f} s / learned {c:.1f} s (true {t:.1f} s)" for e, c, t in runs)
    print(f"last progress line -> job ended: {shown}; median {m:.2f} x the learned cadence, "
          f"hang_k {k:g}")
    return verdict("hang-cadence", "x_cadence", m, "<=", k + 1)


def watch_cpu_main(seconds: float = 60) -> int:
    import psutil

    with sandbox() as cluster:
        sup = config.load(str(cluster.jobwrap_config)).supervisor
        wake = min(sup.gpu_interval, sup.slurm_interval)
        job_id = cluster.submit(SLEEPER.format(name="wcpu"), name="wcpu.sh")
        node = _running_with_watcher(cluster, job_id)
        record = cluster.job_state(job_id).read_json(pid_file(node)) or {}
        watcher = psutil.Process(int(record["pid"]))
        anchor = subprocess.Popen([sys.executable, "-c",
                                   f"import time\nwhile True: time.sleep({wake})"])
        try:
            anchor_proc = psutil.Process(anchor.pid)
            time.sleep(3)  # past both processes' start-up
            w0, a0 = watcher.cpu_times(), anchor_proc.cpu_times()
            time.sleep(seconds)
            w1, a1 = watcher.cpu_times(), anchor_proc.cpu_times()
        finally:
            anchor.kill()
            anchor.wait()
            cluster.as_user(["scancel", job_id])

    def used(t: object) -> float:
        return sum(getattr(t, f) for f in ("user", "system", "children_user",
                                           "children_system"))

    w = 100 * (used(w1) - used(w0)) / seconds
    a = 100 * (used(a1) - used(a0)) / seconds
    print(f"node watcher {w:.3f} % of a core over {seconds:g} s (its scontrol calls "
          f"included); a bare Python loop waking every {wake:g} s: {a:.3f} %")
    return verdict("watch-cpu", "pct", w, "<", 0.5)
