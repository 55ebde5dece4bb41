"""job-start: what jobwrap's hooks add to a many-node job's start, in time and in
slurmctld calls.

A simulated many-node cluster: 32 slurmd on this one host (multiple-slurmd), one fake GPU
each. A 32-node job (``--gres=gpu:1``, ``#JOBWRAP`` directives) runs one task per node
with ``srun``; each task writes its start time. Measured: submit -> every task running.

Subject: the cluster with jobwrap's Prolog, Epilog and TaskProlog. Anchor: the same
cluster, the same job, with those three hook files swapped for ``exit 0`` (Slurm without
jobwrap's hooks; job_submit.lua is in both). Alternating rounds, medians. slurmctld's calls
are counted by RPC type from ``sdiag`` before the submit and after every task runs (and
the supervisor's first look); ``rpcs_per_node`` is jobwrap's share (subject minus anchor,
of the RPC types jobwrap makes) per node.

This host has few cores: all 32 nodes' prologs share them, where on a real cluster each
runs on its own node. The ratio here is therefore an upper bound.

Runs on Debian's Slurm, or on the one in ``JOBWRAP_SLURM_PREFIX`` (25.11).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from jobwrap_dev.sandbox import flavor
from jobwrap_dev.sandbox.cluster import Cluster
from tests.bench.cluster import sandbox
from wrapper.runner import Runner

NODES = 32
HOOKS = ("prolog/prolog", "prolog/task-prolog", "epilog/epilog")
BARE = "#!/bin/sh\n# job-start benchmark: Slurm without jobwrap's hooks\nexit 0\n"
SCRIPT = f"""#!/bin/bash
#SBATCH --nodes={NODES} --ntasks-per-node=1 --gres=gpu:1 --output=js-%j.out
#JOBWRAP --checkpoint-dir=ckpt-js --max-restarts=1
srun sh -c 'date +%s.%N > js-$SLURM_JOB_ID.$SLURM_PROCID.start'
"""


class Hooks:
    """The runtime's three hook files: jobwrap's, or ``exit 0`` (swapped atomically)."""

    def __init__(self, cluster: Cluster) -> None:
        self.paths = [cluster.runtime / hook for hook in HOOKS]
        self.real = {path: path.read_bytes() for path in self.paths}
        self.modes = {path: path.stat().st_mode & 0o777 for path in self.paths}

    def use(self, jobwrap: bool) -> None:
        for path in self.paths:
            tmp = path.with_name(path.name + ".swap")
            tmp.write_bytes(self.real[path] if jobwrap else BARE.encode())
            os.chmod(tmp, self.modes[path])  # as installed: the task-prolog runs as the user
            tmp.replace(path)


def _rpcs(cluster: Cluster) -> dict[str, int]:
    return flavor.rpc_counts(Runner(cluster.env()).run(["sdiag"], timeout=30).stdout)


def _settle(cluster: Cluster, timeout: float = 180) -> None:
    """Every node idle again and no jobwrap helper left: the last round's epilogs and
    supervisor are not billed to the next."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = cluster.node_states()
        if states and all(s.startswith("idle") for s in states.values()) \
                and not cluster.runtime_processes():
            return
        time.sleep(0.5)
    raise RuntimeError(f"job-start: nodes not idle within {timeout:g} s: "
                       f"{cluster.node_states()}")


def _one(cluster: Cluster, jobwrap: bool, hooks: Hooks,
         rpcs: dict[bool, list[dict[str, int]]]) -> float:
    """One job, submit -> every task running, in seconds; its RPCs go to ``rpcs``."""
    _settle(cluster)
    hooks.use(jobwrap)
    before = _rpcs(cluster)
    submitted = time.time()
    job = cluster.submit(SCRIPT, name="js.sh")
    stamps: list[Path] = []
    deadline = time.monotonic() + 300
    while len(stamps) < NODES:  # files only: no Slurm query between the two counts
        if time.monotonic() > deadline:
            raise RuntimeError(f"job-start: job {job} has {len(stamps)} of {NODES} tasks "
                               "running after 300 s")
        time.sleep(0.1)
        stamps = list(cluster.work.glob(f"js-{job}.*.start"))
    time.sleep(3)  # the supervisor's first look at the job
    rpcs[jobwrap].append(flavor.rpc_delta(before, _rpcs(cluster)))
    started = [float(p.read_text().strip() or "inf") for p in stamps]
    cluster.wait_job(job, timeout=300)
    return max(started) - submitted


def main(rounds: int = 5) -> int:
    rpcs: dict[bool, list[dict[str, int]]] = {True: [], False: []}
    times: dict[bool, list[float]] = {True: [], False: []}
    with sandbox(gpus_per_node=1, nodes=NODES) as cluster:
        hooks = Hooks(cluster)
        version = Runner(cluster.env()).run(["sinfo", "--version"], timeout=30).stdout.strip()
        try:
            for i in range(rounds + 1):  # round 0 warms caches (gres, page cache): not kept
                order = (True, False) if i % 2 else (False, True)
                for jobwrap in order:
                    seconds = _one(cluster, jobwrap, hooks, rpcs)
                    if i:
                        times[jobwrap].append(seconds)
                    else:
                        rpcs[jobwrap].pop()
        finally:
            hooks.use(True)
    subject, anchor = statistics.median(times[True]), statistics.median(times[False])
    names = sorted({n for counts in rpcs[True] + rpcs[False] for n in counts})

    def median_of(jobwrap: bool, name: str) -> float:
        return statistics.median(c.get(name, 0) for c in rpcs[jobwrap])

    ours = {n: median_of(True, n) - median_of(False, n) for n in names}
    print(f"{version}, {NODES} slurmd on {os.cpu_count()} cores, {rounds} rounds each")
    print(f"submit -> {NODES} tasks running: with jobwrap's hooks median {subject:.2f} s "
          f"({', '.join(f'{t:.2f}' for t in times[True])}); without "
          f"{anchor:.2f} s ({', '.join(f'{t:.2f}' for t in times[False])})")
    print("slurmctld RPCs per job start (median, with hooks / without): " + (", ".join(
        f"{n} {median_of(True, n):g}/{median_of(False, n):g}" for n in names) or "none"))
    per_node = sum(ours.values()) / NODES
    ratio = subject / anchor
    print(f"job-start ratio={ratio:.2f} rpcs_per_node={per_node:.2f} goal<=1.2")
    return 0 if ratio <= 1.2 else 1


if __name__ == "__main__":
    sys.exit(main())
