"""straggler: a slow node named with no change to the script, and what the samples cost.

One sandbox of three nodes, the pulse at the site's defaults (a sample every 3 s; a node
named when its speed score stays under 0.85 for 30 s, scores over 60 s windows: the
sandbox's shorter 30 s and 15 s are put back). A real 3-rank gloo DDP job, one rank per
node, each rank one thread on its node's two CPUs and always on a CPU
(jobwrap_dev/sandbox/pauses_train.py, a wide step and no sleep):

- ``name_s``: once it trains, n3's rank is held to 0.45 of a CPU (a cgroup quota,
  jobwrap_dev/sandbox/throttle.py; its share of this host's two cores is 0.67: ~30%
  slower); seconds from then until root's ``pulse.slow`` names n3 (``STRAGGLER_RUNS``,
  3; the worst kept). A run naming any other node fails the bench;
- ``false_named``: nodes named in the same job left balanced for ``STRAGGLER_BALANCED_S``
  (600) seconds;
- ``overhead_pct``: the CPU the three node watchers used (their py-spy children
  included) per CPU second of the job's ranks, in 120 s stretches of the balanced job
  (median), less the same in the anchor: the same job with ``[pulse] samples = false``
  (the watchers without the sampler), run before and after it (median), in %.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from pathlib import Path

import psutil

import jobwrap_dev.sandbox
from jobwrap_dev.sandbox.cluster import Cluster
from jobwrap_dev.sandbox.throttle import throttled
from tests.bench.cluster import sandbox

TORCH = Path("/opt/jobwrap/frameworks/bin/python")
PAYLOAD = Path(jobwrap_dev.sandbox.__file__).parent / "pauses_train.py"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT"}
NODES = ("n1", "n2", "n3")
STRETCH = 120.0
JOB = f"""#!/bin/bash
#SBATCH --output={{name}}-%j.out -N3 --ntasks-per-node=1 -c 2 --mem=0
#JOBWRAP --max-restarts=0 --hang-timeout=off
export PORT=$((20000 + SLURM_JOB_ID % 20000)) WORLD_SIZE=3 TRAIN_WIDTH=512 TRAIN_SLEEP=0
export OMP_NUM_THREADS=1
srun bash -c 'RANK=$SLURM_NODEID exec {TORCH} pauses_train.py 0 -1'
"""


def _configure(cluster: Cluster, samples: bool) -> None:
    text = cluster.jobwrap_config.read_text()
    text = "".join(line for line in text.splitlines(keepends=True)
                   if not line.startswith(("slow_window", "slow_hold", "samples = ")))
    if not samples:
        text = text.replace("[pulse]\n", "[pulse]\nsamples = false\n")
    cluster.jobwrap_config.write_text(text)


def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


def _training(cluster: Cluster, name: str) -> tuple[str, dict[str, psutil.Process]]:
    job_id = cluster.submit(JOB.format(name=name), name=f"{name}.sh")
    cluster.wait_job(job_id, states={"RUNNING"}, timeout=60)
    cluster.wait_output(cluster.work / f"{name}-{job_id}.out", "step 100 at", timeout=240)
    ranks = {n: psutil.Process(pid) for n, pid in cluster.python_ranks(job_id).items()}
    if sorted(ranks) != list(NODES):
        raise RuntimeError(f"job {job_id}: ranks on {sorted(ranks)}")
    return job_id, ranks


def _end(cluster: Cluster, job_id: str) -> None:
    cluster.as_user(["scancel", job_id])
    cluster.wait_job(job_id, states=TERMINAL, timeout=120)


def _named(cluster: Cluster, job_id: str) -> list[dict[str, object]]:
    return [e for e in cluster.events(job_id, root_only=True) if e["event"] == "pulse.slow"]


def _shares(cluster: Cluster, name: str, seconds: float) -> tuple[list[float], int]:
    """The watchers' CPU per CPU second of the ranks in each STRETCH of ``seconds``, and
    the nodes the pulse named in that time."""
    job_id, ranks = _training(cluster, name)
    watchers = [psutil.Process(pid) for n in NODES
                if (pid := cluster.watcher_pid(job_id, n))]
    if len(watchers) != len(NODES):
        raise RuntimeError(f"job {job_id}: {len(watchers)} watchers")
    shares = []
    for _ in range(max(1, round(seconds / STRETCH))):
        w0, r0 = _cpu(watchers), _cpu(list(ranks.values()))
        time.sleep(STRETCH)
        w1, r1 = _cpu(watchers), _cpu(list(ranks.values()))
        shares.append((w1 - w0) / max(r1 - r0, 1e-9))
    named = len(_named(cluster, job_id))
    _end(cluster, job_id)
    return shares, named


def _name_once(cluster: Cluster, run: int) -> float:
    job_id, ranks = _training(cluster, f"slow{run}")
    try:
        with throttled(ranks["n3"].pid, 0.45, f"jobwrap-bench-slow-{job_id}"):
            started, deadline = time.time(), time.monotonic() + 300
            while time.monotonic() < deadline:
                named = _named(cluster, job_id)
                if named:
                    time.sleep(10)  # another node named beside it would be by now
                    named = _named(cluster, job_id)
                    if [e["slow"] for e in named] != ["n3"]:
                        raise RuntimeError(f"job {job_id}: named {named}")
                    return float(named[0]["ts"]) - started  # type: ignore[arg-type]
                time.sleep(1)
            raise RuntimeError(f"job {job_id}: n3 never named")
    finally:
        _end(cluster, job_id)


def main() -> int:
    runs = int(os.environ.get("STRAGGLER_RUNS", "3"))
    balanced = float(os.environ.get("STRAGGLER_BALANCED_S", "600"))
    with sandbox(gpus_per_node=1, nodes=3) as cluster:
        cluster.write_user_file("pauses_train.py", PAYLOAD.read_text())
        _configure(cluster, samples=False)
        before, _ = _shares(cluster, "anchor-a", STRETCH)
        _configure(cluster, samples=True)
        sampled, false_named = _shares(cluster, "balanced", balanced)
        _configure(cluster, samples=False)
        after, _ = _shares(cluster, "anchor-b", STRETCH)
        _configure(cluster, samples=True)
        names = []
        for i in range(runs):
            names.append(_name_once(cluster, i))
            print(f"straggler run {i}: n3 named after {names[-1]:.1f} s", flush=True)
    anchor = statistics.median(before + after)
    share = statistics.median(sampled)
    overhead = 100 * (share - anchor)
    print(f"straggler name per run: {' '.join(f'{s:.1f}' for s in names)} s; watchers' CPU "
          f"per rank CPU second, per {STRETCH:g} s: "
          f"{' '.join(f'{100 * s:.3f}' for s in sampled)} % with the samples, "
          f"{' '.join(f'{100 * s:.3f}' for s in before + after)} % without; nodes named in "
          f"{balanced:g} s balanced: {false_named}")
    ok = max(names) <= 120 and overhead <= 1.0 and false_named == 0
    print(f"straggler name_s={max(names):.1f} overhead_pct={overhead:.2f} "
          f"false_named={false_named} runs={runs} "
          f"goal name_s<=120 overhead_pct<=1 false_named==0")
    return 0 if ok else 1
