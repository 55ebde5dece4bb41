"""Restart benchmarks on the real local Slurm (root):

- restart-requeue: crash of the payload -> first line of the requeued attempt, against
  the floor of the same cluster, submit -> first line of a fresh job;
- restart-inplace: the same under ``jobwrap run``, against a bare interpreter start;
- supervisor-cpu: the supervisor's CPU share while it follows a running job for a
  minute, against a bare Python loop waking as often.
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from jobwrap_dev.sandbox.cluster import Cluster
from tests.bench.cluster import sandbox
from tests.bench.timing import verdict

STAMP = re.compile(r"^(\w+) ([\d.]+)$", re.M)

CRASHER = """#!/bin/bash
#SBATCH --output={name}-%j.out
#SBATCH --open-mode=append
#JOBWRAP --checkpoint-dir=ckpt-{name} --max-restarts=2
{wrap}python3 -c '
import os, sys, time
a = os.environ.get("JOBWRAP_ATTEMPT", "0")
print("start" + a, time.time(), flush=True)
if a == "0":
    print("crash", time.time(), flush=True)
    sys.exit(3)
'
"""

FRESH = """#!/bin/bash
#SBATCH --output=fresh-%j.out
python3 -c 'import time; print("start0", time.time(), flush=True)'
"""


def _stamps(path: Path) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for m in STAMP.finditer(path.read_text())}


def _requeue_once(cluster: Cluster, wrap: str, name: str) -> float:
    job_id = cluster.submit(CRASHER.format(name=name, wrap=wrap), name=f"{name}.sh")
    cluster.wait_job(job_id, states={"COMPLETED", "FAILED"}, timeout=120)
    stamps = _stamps(cluster.work / f"{name}-{job_id}.out")
    return stamps["start1"] - stamps["crash"]


def _fresh_once(cluster: Cluster) -> float:
    submitted = time.time()
    job_id = cluster.submit(FRESH, name="fresh.sh")
    cluster.wait_job(job_id, timeout=60)
    return _stamps(cluster.work / f"fresh-{job_id}.out")["start0"] - submitted


def requeue_main(rounds: int = 5) -> int:
    with sandbox() as cluster:
        subject, anchor = [], []
        for _ in range(rounds):
            subject.append(_requeue_once(cluster, "", "rq"))
            anchor.append(_fresh_once(cluster))
    s, a = statistics.median(subject), statistics.median(anchor)
    print(f"crash -> next attempt median {s:.2f} s; submit -> first line of a fresh job "
          f"median {a:.2f} s (Slurm's own requeue delay is 121 s)")
    return verdict("restart-requeue", "s", s, "<=", 10)


def inplace_main(rounds: int = 9) -> int:
    with sandbox() as cluster:
        jobwrap = cluster.runtime / "venv" / "bin" / "jobwrap"
        subject = [_requeue_once(cluster, f"{jobwrap} run --checkpoint-dir=ckpt-ip "
                                          "--max-restarts=2 -- ", "ip")
                   for _ in range(rounds)]
    anchor = []
    for _ in range(rounds):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        anchor.append(time.perf_counter() - started)
    s, a = statistics.median(subject), statistics.median(anchor)
    print(f"crash -> next in-place attempt median {s:.3f} s; bare interpreter start "
          f"median {a:.3f} s")
    return verdict("restart-inplace", "s", s, "<=", 2)


def supervisor_cpu_main(seconds: float = 60) -> int:
    import psutil

    with sandbox() as cluster:
        job_id = cluster.submit(
            "#!/bin/bash\n#SBATCH --output=cpu-%j.out\n#JOBWRAP --checkpoint-dir=ckpt-cpu "
            "--hang-timeout=1h\nfor i in $(seq 1 200); do echo tick $i; sleep 0.5; done\n",
            name="cpu.sh")
        cluster.wait_job(job_id, states={"RUNNING"}, timeout=60)
        supervisor = None
        deadline = time.monotonic() + 20
        while supervisor is None and time.monotonic() < deadline:
            for proc in psutil.process_iter(["cmdline"]):
                if proc.info["cmdline"] and proc.info["cmdline"][-2:] == ["supervise", job_id]:
                    supervisor = proc
            time.sleep(0.2)
        if supervisor is None:
            print("supervisor-cpu: no supervisor process found", file=sys.stderr)
            return 1
        anchor = subprocess.Popen([sys.executable, "-c",
                                   "import time\nwhile True: time.sleep(2)"])
        try:
            anchor_proc = psutil.Process(anchor.pid)
            time.sleep(3)  # past both processes' start-up
            s0, a0 = supervisor.cpu_times(), anchor_proc.cpu_times()
            time.sleep(seconds)
            s1, a1 = supervisor.cpu_times(), anchor_proc.cpu_times()
        finally:
            anchor.kill()
            anchor.wait()
    s = 100 * ((s1.user + s1.system) - (s0.user + s0.system)) / seconds
    a = 100 * ((a1.user + a1.system) - (a0.user + a0.system)) / seconds
    print(f"supervisor {s:.3f} % of a core over {seconds:g} s; a bare Python loop waking "
          f"every 2 s: {a:.3f} %")
    return verdict("supervisor-cpu", "pct", s, "<", 1)
