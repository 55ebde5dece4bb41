"""hang-detect: a hang ended in seconds, and long pauses that are not hangs left alone.

One sandbox of three nodes; the pulse at its defaults (a sample of every rank each 3 s, a
hang after 15 s stuck). Each run is a real 2-rank gloo DDP job (one rank on n1, one on
n2, jobwrap_dev/sandbox/pauses_train.py) whose command runs under ``jobwrap run``: after
five steps, four pauses of ``HANG_PHASE`` s (32: twice the floor, and more) that are not
hangs (rank 0 writes a checkpoint while rank 1 waits at a barrier; rank 0's first step
compiles; rank 0 evaluates; every rank waits on its data loader), then rank 1 stops for
good before an all-reduce. Beside it, on n3, the fifth case: a one-process job that waits
twice the phase in one call. Measured from rank 1's own ``stuck`` line:

- ``detect_s``: until root's ``pulse.hang`` names it;
- ``end_s``: until the supervisor ended the stuck command (``hang.in_place``);
- ``resume_s``: until the first step of the command ``jobwrap run`` restarted in place;
- ``false_alarms``: ``pulse.hang`` or ``hang`` events before that line, in either job.

The anchor, alternating with the first runs: the same job and hang with ``[pulse] samples
= false``: the supervisor's own rule, at the sandbox's shortened floor (``hang_floor`` 40
s; at a site's defaults it is 1,800 s before a job's cadence is learned, 300 s after);
its pauses are skipped (the rule has no false alarm to show on them: it sees output).
The last line has the worst run of the pulse (``HANG_RUNS``, 3).
"""

from __future__ import annotations

import os
import re
import statistics
from pathlib import Path

import jobwrap_dev.sandbox
from jobwrap_dev.sandbox.cluster import Cluster
from tests.bench.cluster import sandbox

TORCH = Path("/opt/jobwrap/frameworks/bin/python")
PAYLOAD = Path(jobwrap_dev.sandbox.__file__).parent / "pauses_train.py"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT"}
STEP = re.compile(r"^step \d+ at ([\d.]+)$", re.M)


def _script(cluster: Cluster, name: str, phase: float) -> str:
    jobwrap = cluster.runtime / "venv" / "bin" / "jobwrap"
    rank = ('export RANK=$SLURM_NODEID WORLD_SIZE=2 '
            'PORT=$((20000 + (SLURM_JOB_ID + ${JOBWRAP_ATTEMPT:-0} * 97) % 20000)); '
            f'exec {TORCH} pauses_train.py {phase:g} 1 20')
    return f"""#!/bin/bash
#SBATCH --output={name}-%j.out -N2 --ntasks-per-node=1 --mem=0
#JOBWRAP --max-restarts=2
{jobwrap} run -- srun bash -c '{rank}'
"""


def _set_samples(cluster: Cluster, on: bool) -> None:
    text = cluster.jobwrap_config.read_text().replace("[pulse]\nsamples = false\n",
                                                      "[pulse]\n")
    if not on:
        text = text.replace("[pulse]\n", "[pulse]\nsamples = false\n")
    cluster.jobwrap_config.write_text(text)


def _one(cluster: Cluster, pulse: bool, run: int, phase: float) -> dict[str, float]:
    name = f"hd{'p' if pulse else 'a'}{run}"
    _set_samples(cluster, pulse)
    job_id = cluster.submit(_script(cluster, name, phase if pulse else 0), "-w", "n1,n2",
                            name=f"{name}.sh")
    alone = cluster.submit(f"""#!/bin/bash
#SBATCH --output={name}-one-%j.out -N1
#JOBWRAP --max-restarts=0
python3 one.py {2 * phase:g}
""", "-w", "n3", name=f"{name}-one.sh") if pulse else ""
    info = cluster.wait_job(job_id, states=TERMINAL, timeout=900)
    output = (cluster.work / f"{name}-{job_id}.out").read_text(errors="replace")
    if info["JobState"] != "COMPLETED" or "rank 1: stuck at " not in output:
        raise RuntimeError(f"job {job_id}: {info['JobState']}: {output[-3000:]}")
    stuck = float(output.split("rank 1: stuck at ")[1].split()[0])
    resumed = output.split("rank 0: resumed at ", 1)
    first = min((float(t) for t in STEP.findall(resumed[1])), default=float("nan")) \
        if len(resumed) > 1 else float("nan")
    events = cluster.events(job_id)
    false = 0
    if alone:
        cluster.wait_job(alone, states=TERMINAL, timeout=300)
        false = sum(1 for e in cluster.events(alone) if e["event"] in ("pulse.hang", "hang"))

    def first_ts(kind: str) -> float:
        return min((float(e["ts"]) for e in events if e["event"] == kind
                    and float(e["ts"]) > stuck), default=float("nan"))

    false += sum(1 for e in events if e["event"] in ("pulse.hang", "hang")
                 and float(e["ts"]) < stuck)
    return {"detect_s": first_ts("pulse.hang" if pulse else "hang") - stuck,
            "end_s": first_ts("hang.in_place") - stuck, "resume_s": first - stuck,
            "false_alarms": float(false)}


def main() -> int:
    runs = int(os.environ.get("HANG_RUNS", "3"))
    anchors = int(os.environ.get("HANG_ANCHOR_RUNS", "1"))
    phase = float(os.environ.get("HANG_PHASE", "32"))
    pulse: list[dict[str, float]] = []
    anchor: list[dict[str, float]] = []
    with sandbox(gpus_per_node=1, nodes=3) as cluster:
        cluster.write_user_file("pauses_train.py", PAYLOAD.read_text())
        cluster.write_user_file("one.py", (PAYLOAD.parent / "one_process.py").read_text())
        for i in range(max(runs, anchors)):
            if i < runs:
                pulse.append(_one(cluster, True, i, phase))
                print("pulse run", i, pulse[-1], flush=True)
            if i < anchors:
                anchor.append(_one(cluster, False, i, phase))
                print("anchor run", i, anchor[-1], flush=True)

    def shown(rows: list[dict[str, float]], key: str) -> str:
        return " ".join(f"{r[key]:.1f}" for r in rows)

    print(f"hang-detect pulse per run: detect {shown(pulse, 'detect_s')}; end "
          f"{shown(pulse, 'end_s')}; resume {shown(pulse, 'resume_s')}; false alarms "
          f"{shown(pulse, 'false_alarms')} (four pauses of {phase:g} s and a one-process "
          f"job each); supervisor alone (hang_floor 40 s here, 1,800 s at a site's "
          f"defaults): detect {shown(anchor, 'detect_s')}, end {shown(anchor, 'end_s')}, "
          f"resume {shown(anchor, 'resume_s')}; medians of the pulse: detect "
          f"{statistics.median(r['detect_s'] for r in pulse):.1f}")
    worst = {k: max(r[k] for r in pulse) for k in ("detect_s", "end_s", "resume_s",
                                                   "false_alarms")}
    ok = worst["end_s"] <= 30 and worst["false_alarms"] == 0
    print(f"hang-detect detect_s={worst['detect_s']:.1f} end_s={worst['end_s']:.1f} "
          f"resume_s={worst['resume_s']:.1f} false_alarms={worst['false_alarms']:.0f} "
          f"anchor_end_s={max(r['end_s'] for r in anchor):.1f} runs={runs} "
          f"goal end_s<=30 false_alarms==0")
    return 0 if ok else 1
