"""Hang detection with no --hang-timeout, on a real 2-rank gloo DDP job (torch, CPU).

Rank 1 stops before its all-reduce at step 4 of the first attempt while rank 0 waits
inside it: no output, no checkpoint. The pulse's judge of the ranks' samples names rank 1
after [pulse] hang_floor (15 s), before the supervisor's own hang_floor; the supervisor
ends the job, and the epilog must requeue it; the second attempt resumes from rank 0's
checkpoint and finishes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from jobwrap_dev.sandbox.cluster import Cluster

TORCH = Path("/opt/jobwrap/frameworks/bin/python")
STEPS = 8
TRAIN = '''
import json, os, sys, time, zipfile
import torch, torch.distributed as dist, torch.multiprocessing as mp

def main(rank, steps, ckdir):
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"],
                            rank=rank, world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    start, total = 0, 0
    resume = os.environ.get("JOBWRAP_RESUME_FROM")
    if resume:
        with zipfile.ZipFile(resume) as z:
            saved = json.loads(z.read("state.json"))
        start, total = saved["step"], saved["sum"]
    attempt = os.environ.get("JOBWRAP_ATTEMPT")
    if rank == 0:
        print(f"attempt={attempt} resume={resume} start={start}", flush=True)
    for step in range(start + 1, steps + 1):
        if rank == 1 and step == 4 and attempt == "0":
            time.sleep(100000)  # rank 1 is stuck; rank 0 waits in the all-reduce
        t = torch.tensor([float(step)])
        dist.all_reduce(t)
        total += int(t.item()) // 2
        if rank == 0:
            tmp = os.path.join(ckdir, f".s{step}.tmp")
            with zipfile.ZipFile(tmp, "w") as z:
                z.writestr("state.json", json.dumps({"step": step, "sum": total}))
            os.replace(tmp, os.path.join(ckdir, f"epoch=0-step={step}.ckpt"))
            print(f"step {step} sum {total}", flush=True)
        time.sleep(0.5)
    if rank == 0:
        print(f"done sum {total}", flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    ckdir = os.environ["JOBWRAP_CHECKPOINT_DIR"]
    os.makedirs(ckdir, exist_ok=True)
    mp.spawn(main, args=(int(sys.argv[1]), ckdir), nprocs=2)
'''


def test_a_rank_stuck_in_a_collective_is_a_hang_without_hang_timeout(cluster: Cluster) -> None:
    assert TORCH.exists(), f"{TORCH} is missing: tools/bootstrap makes the framework venv"
    cluster.write_user_file("ddp_train.py", TRAIN)
    shutil.rmtree(cluster.work / "ckpt-ddp", ignore_errors=True)
    job_id = cluster.submit(f"""#!/bin/bash
#SBATCH --output=ddp-%j.out --open-mode=append
#JOBWRAP --checkpoint-dir=ckpt-ddp --max-restarts=2
export PORT=$((20000 + SLURM_JOB_ID % 20000))
{TORCH} ddp_train.py {STEPS}
""", name="ddp.sh")
    info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
    output = (cluster.work / f"ddp-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, output)
    assert f"done sum {STEPS * (STEPS + 1) // 2}" in output, output
    assert "start=3" in output, output  # resumed from step 3's checkpoint
    events = cluster.events(job_id)
    hang = [e for e in events if e["event"] == "hang"]
    assert len(hang) == 1 and hang[0]["found_by"] == "pulse", hang  # before hang_floor
    ends = [(e["attempt"], e["kind"], e["decision"]) for e in events
            if e["event"] == "attempt.end" and e["source"] == "root"]
    assert ends == [(0, "hang", "requeue"), (1, "success", "done")], ends
    _check_forensics(cluster, job_id, events, output)


def _check_forensics(cluster: Cluster, job_id: str, events: list[dict[str, object]],
                     output: str) -> None:
    """Before the end, the watchers read both ranks' stacks: rank 1, asleep outside the
    all-reduce rank 0 waits in, is named in root's record, the output, the status and the
    archive."""
    stuck_at = "main (ddp_train.py:" + str(next(
        i for i, line in enumerate(TRAIN.splitlines(), 1) if "time.sleep(100000)" in line)) + ")"
    named = [e for e in events if e["event"] == "hang.forensics" and e["source"] == "root"]
    assert len(named) == 1 and named[0]["attempt"] == 0, named
    [found] = [e for e in events if e["event"] == "pulse.hang"]
    assert len(found["stuck"]) == 1 and stuck_at in found["stuck"][0], found
    odd = named[0]["odd"]
    assert isinstance(odd, list) and len(odd) == 1 and stuck_at in odd[0], named
    assert "1 of 2 ranks wait inside a collective" in str(named[0]["why"]), named
    assert "hang forensics of attempt 0: standing apart:" in output and stuck_at in output
    status = subprocess.run([str(cluster.runtime / "venv" / "bin" / "jobwrap"), "--config",
                             str(cluster.jobwrap_config), "status", job_id],
                            capture_output=True, text=True, env=cluster.env(), timeout=60,
                            check=False)
    assert status.returncode == 0 and stuck_at in status.stdout, status
    archive = cluster.base / "jobwrap" / "archive" / cluster.spec.user / job_id
    parts = [json.loads(p.read_text()) for p in archive.glob("attempt-0/*/part.json")]
    taken = [p["extra"]["forensics"] for p in parts if "forensics" in p.get("extra", {})]
    assert taken, [sorted(p) for p in parts]
    ranks = [r for f in taken for r in f["ranks"] if r.get("frames")]
    assert len(ranks) == 2 and any(stuck_at == r["signature"] for r in ranks), taken
    assert all(r["in_collective"] for r in ranks if r["signature"] != stuck_at), taken


def test_a_hang_under_jobwrap_run_is_restarted_in_place(cluster: Cluster) -> None:
    """The job's command runs under ``jobwrap run``, its rank in an srun step. The rank
    stops (SIGSTOP) at step 3 of the first run: the supervisor calls it hung, waits for
    the watchers' forensics, then kills the job's steps only (not the job). ``jobwrap
    run`` sees its command fail after the hang and restarts it in the same allocation
    from step 3's checkpoint: no requeue (Slurm's restart count stays 0), and root's
    epilog classes the one attempt by how it ended: success."""
    import jobwrap_dev.sandbox

    payload = Path(jobwrap_dev.sandbox.__file__).parent / "toy_train.py"
    cluster.write_user_file("train.py", payload.read_text())
    shutil.rmtree(cluster.work / "ckpt-hangrun", ignore_errors=True)
    jobwrap = cluster.runtime / "venv" / "bin" / "jobwrap"
    steps = 8
    job_id = cluster.submit(f"""#!/bin/bash
#SBATCH --output=hangrun-%j.out --open-mode=append
#JOBWRAP --checkpoint-dir=ckpt-hangrun --max-restarts=2 --hang-timeout=10s
export CRASH_AT=3 CRASH_HOW=hang
{jobwrap} run -- srun python3 train.py {steps} 0.4
""", name="hangrun.sh")
    info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"},
                            timeout=240)
    output = (cluster.work / f"hangrun-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "0", (info, output)
    assert f"done sum {steps * (steps + 1) // 2}" in output, output
    assert "jobwrap run: attempt 0 ended: hang (" in output and \
        "restarting in place" in output, output
    assert "attempt=1 resume=" in output and "start=3" in output, output
    events = cluster.events(job_id)
    hangs = [e for e in events if e["event"] == "hang"]
    assert len(hangs) == 1 and hangs[0]["attempt"] == 0, hangs
    [in_place] = [e for e in events if e["event"] == "hang.in_place"]
    assert in_place["steps"] and all(s.startswith(f"{job_id}.") for s in in_place["steps"])
    taken = [e for e in events if e["event"] == "watch.forensics" and e["source"] == "root"]
    assert taken and all(e["attempt"] == 0 for e in taken), taken  # before the kill
    ends = [(e["attempt"], e["kind"], e["decision"]) for e in events
            if e["event"] == "attempt.end" and e["source"] == "root"]
    assert ends == [(0, "success", "done")], ends
