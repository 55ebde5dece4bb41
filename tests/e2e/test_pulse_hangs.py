"""Hangs judged from every rank's samples (wrapper/pulse/judge.py) on real torch ranks.

The pulse runs its defaults here (a sample every 3 s, a hang after 15 s stuck). Real gloo
DDP jobs, ranks on two nodes: a rank stuck among 16 is named; five long pauses that are
not hangs (each at least twice the floor) are never called one, and the same job's real
hang at the end is, which shows the judge was awake all along.
"""

from __future__ import annotations

from pathlib import Path

import jobwrap_dev.sandbox
from jobwrap_dev.sandbox.cluster import Cluster

TORCH = Path("/opt/jobwrap/frameworks/bin/python")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT"}
PHASE = 32  # seconds of each pause: at least twice [pulse] hang_floor (15 s)

PAYLOAD = Path(jobwrap_dev.sandbox.__file__).parent / "pauses_train.py"
ONE = Path(jobwrap_dev.sandbox.__file__).parent / "one_process.py"

def _job(name: str, per_node: int, phase: float, stuck: int, *, nodes: int = 2,
         env: str = "") -> str:
    return f"""#!/bin/bash
#SBATCH --output={name}-%j.out -N{nodes} --ntasks-per-node=1 --mem=0
#JOBWRAP --max-restarts=0
export PORT=$((20000 + SLURM_JOB_ID % 20000)) WORLD_SIZE={nodes * per_node} {env}
# a heartbeat of its own, as many jobs print (a logger's thread): the job's output grows
# for ever, so the supervisor's rule (no output) never sees the hang; the pulse does
(while sleep 5; do echo "batch: alive at $(date +%s)"; done) &
srun bash -c 'for i in $(seq 0 {per_node - 1}); do
  RANK=$((SLURM_NODEID * {per_node} + i)) {TORCH} pauses_train.py {phase} {stuck} &
done; wait'
"""


def _hangs(cluster: Cluster, job_id: str) -> tuple[list[dict[str, object]],
                                                   list[dict[str, object]]]:
    events = cluster.events(job_id)
    return ([e for e in events if e["event"] == "pulse.hang" and e["source"] == "root"],
            [e for e in events if e["event"] == "hang"])


def test_the_stuck_rank_among_16_on_two_nodes_is_named(cluster: Cluster) -> None:
    assert TORCH.exists(), f"{TORCH} is missing: tools/bootstrap makes the framework venv"
    cluster.write_user_file("pauses_train.py", PAYLOAD.read_text())
    # each rank dumps PyTorch's flight recorder once stalled 6 s, as NCCL's watchdog does
    # on a timeout: the task-prolog turned the recorder on and named the file
    job_id = cluster.submit(_job("stuck16", 8, 0, 13, env="FR_DUMP_AFTER=6"), "-w", "n1,n2",
                            name="stuck16.sh")
    info = cluster.wait_job(job_id, states=TERMINAL, timeout=300)
    output = (cluster.work / f"stuck16-{job_id}.out").read_text()
    verdicts, hangs = _hangs(cluster, job_id)
    assert len(verdicts) == 1, (verdicts, output[-3000:])
    [named] = verdicts[0]["stuck"]
    assert str(named).startswith("rank 13 (pid ") and " on n2) at <module> (pauses_train.py:" \
        in str(named), verdicts
    assert verdicts[0]["ranks"] == 16 and verdicts[0]["waiting"] == 15, verdicts
    [flight] = verdicts[0]["flight"]  # 15 ranks entered the all-reduce rank 13 never did
    assert str(flight).startswith("rank 13 never joined gloo:all_reduce #") and \
        "15 of 16 ranks entered gloo:all_reduce" in str(verdicts[0]["why"]), verdicts
    assert len(hangs) == 1 and hangs[0]["found_by"] == "pulse", hangs
    assert hangs[0]["stuck"] == verdicts[0]["stuck"], hangs
    ends = [(e["attempt"], e["kind"]) for e in cluster.events(job_id)
            if e["event"] == "attempt.end" and e["source"] == "root"]
    assert ends == [(0, "hang")] and info["JobState"] != "COMPLETED", (ends, info)
    assert "rank 13" in output and "hang forensics of attempt 0: standing apart:" in output
    assert "PyTorch's flight recorder: rank 13 never joined gloo:all_reduce #" in output, \
        output[-3000:]


def test_long_pauses_are_no_hang_and_the_real_one_after_them_is(cluster: Cluster) -> None:
    cluster.write_user_file("pauses_train.py", PAYLOAD.read_text())
    cluster.write_user_file("one.py", ONE.read_text())
    job_id = cluster.submit(_job("pauses", 1, PHASE, 1), "-w", "n1,n2", name="pauses.sh")
    alone = cluster.submit(f"""#!/bin/bash
#SBATCH --output=one-%j.out -N1
#JOBWRAP --max-restarts=0
python3 one.py {2 * PHASE}
""", "-w", "n3", name="one.sh")
    info = cluster.wait_job(job_id, states=TERMINAL, timeout=420)
    output = (cluster.work / f"pauses-{job_id}.out").read_text()
    for phase in ("checkpoint", "compile", "evaluate", "loader", "pauses over"):
        assert f"rank 0: {phase} at" in output, output[-3000:]
    verdicts, hangs = _hangs(cluster, job_id)
    assert len(verdicts) == 1 and len(hangs) == 1, (verdicts, hangs, output[-3000:])
    stuck_at = float(output.split("rank 1: stuck at ")[1].split()[0])
    assert hangs[0]["ts"] > stuck_at, (hangs, stuck_at)  # none before the real hang
    assert str(verdicts[0]["stuck"][0]).startswith("rank 1 (pid "), verdicts
    assert info["JobState"] != "COMPLETED", info
    one = cluster.wait_job(alone, states=TERMINAL, timeout=120)
    assert one["JobState"] == "COMPLETED", one
    assert _hangs(cluster, alone) == ([], [])

