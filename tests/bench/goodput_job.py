"""The goodput benchmark's job: its training script and its two batch scripts.

The training script is what a careful user writes today: 2-rank DDP over gloo on
loopback (one thread), a DCP checkpoint every SAVE_EVERY steps, resuming from jobwrap's
``JOBWRAP_RESUME_FROM`` when set, else from its own newest *complete* checkpoint by
name (DCP writes ``.metadata`` last), a collective timeout, and a save at the next step
when asked: SIGUSR1, or jobwrap's ``$JOBWRAP_SAVE_FILE`` appearing (the one test
docs/recovery.md asks of a loop; unset without jobwrap). The ranks agree on it with
one tiny all-reduce a step, since a DCP save is collective. Rank 0 writes one
timestamped line per step to ``steps.log`` (the benchmark's ground truth) and each rank
its pid and node to ``pid-RANK``.
"""

from __future__ import annotations

STEPS = 600  # enough for every fault to end a launch of its own, the walltime's included
SAVE_EVERY = 10
STEP_SLEEP = 0.2
COLLECTIVE_TIMEOUT = 60  # seconds: what a careful user sets so a stuck peer ends the run

TRAIN = r'''
import os, signal, sys, time
T0 = time.time()
RUN = os.environ["GP_RUN"]
rank = int(os.environ["SLURM_PROCID"])
launch = "{}.{}.{}".format(os.environ["SLURM_JOB_ID"], os.environ.get("SLURM_STEP_ID", "0"),
                           os.environ.get("SLURM_RESTART_COUNT", "0"))
attempt = os.environ.get("JOBWRAP_ATTEMPT", "-")


def log(line):
    if rank == 0:
        with open(os.path.join(RUN, "steps.log"), "a") as f:
            f.write(line + "\n")


log(f"launch {launch} {T0:.3f} {attempt}")
with open(os.path.join(RUN, f"pid-{rank}.tmp"), "w") as f:
    f.write(f"{os.getpid()} {os.environ.get('SLURMD_NODENAME', '')} {launch}\n")
os.replace(os.path.join(RUN, f"pid-{rank}.tmp"), os.path.join(RUN, f"pid-{rank}"))
save_now = []
signal.signal(signal.SIGUSR1, lambda *_: save_now.append(1))
SAVE_FILE = os.environ.get("JOBWRAP_SAVE_FILE", "")

import datetime
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.nn.parallel import DistributedDataParallel

torch.set_num_threads(1)
STEPS, SAVE_EVERY, SLEEP = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
CKPT = os.environ.get("JOBWRAP_CHECKPOINT_DIR") or os.environ["GP_CKPT"]
os.makedirs(CKPT, exist_ok=True)
port = 20000 + (int(os.environ["SLURM_JOB_ID"]) * 97 + int(os.environ.get("SLURM_STEP_ID", "0"))
                * 13 + int(os.environ.get("SLURM_RESTART_COUNT", "0")) * 7) % 20000
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=int(os.environ["SLURM_NTASKS"]),
                        timeout=datetime.timedelta(seconds=float(sys.argv[4])))
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)))
optim = torch.optim.SGD(model.parameters(), lr=0.05)


def newest():
    done = [int(n[5:]) for n in os.listdir(CKPT) if n.startswith("step_") and n[5:].isdigit()
            and os.path.exists(os.path.join(CKPT, n, ".metadata"))]
    return os.path.join(CKPT, f"step_{max(done)}") if done else ""


start = 0
resume = os.environ.get("JOBWRAP_RESUME_FROM") or newest()
if resume:
    state = {"model": model.state_dict(), "optim": optim.state_dict(), "step": 0}
    dcp.load(state, checkpoint_id=resume)
    model.load_state_dict(state["model"])
    optim.load_state_dict(state["optim"])
    start = int(state["step"])
handled = time.time()  # a request older than this launch was for an earlier one
log(f"resumed {launch} {start} {time.time():.3f}")
print(f"rank {rank}: launch {launch} attempt {attempt} resumed from {resume or '-'} at {start}",
      flush=True)
for step in range(start, STEPS):
    gen = torch.Generator().manual_seed(step * 2 + rank)
    x = torch.randn(8, 16, generator=gen)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    optim.zero_grad()
    loss.backward()
    optim.step()
    asked = 0.0  # jobwrap's save request: the file's mtime, once per request
    if SAVE_FILE:
        try:
            asked = os.stat(SAVE_FILE).st_mtime
        except OSError:
            pass
    want = torch.tensor([1.0 if save_now or asked > handled else 0.0, asked],
                        dtype=torch.float64)
    dist.all_reduce(want, op=dist.ReduceOp.MAX)  # every rank saves, or none
    if (step + 1) % SAVE_EVERY == 0 or (want[0].item() and (step + 1) != start):
        save_now.clear()
        handled = max(handled, want[1].item())
        dcp.save({"model": model.state_dict(), "optim": optim.state_dict(), "step": step + 1},
                 checkpoint_id=os.path.join(CKPT, f"step_{step + 1}"))
    log(f"step {launch} {step + 1} {time.time():.3f}")
    if rank == 0:
        print(f"step {step + 1} t={time.time():.3f}", flush=True)
    time.sleep(SLEEP)
dist.barrier()
log(f"done {launch} {time.time():.3f}")
dist.destroy_process_group()
'''


def srun(python: str) -> str:
    return (f"srun --kill-on-bad-exit=1 {python} train.py {STEPS} {SAVE_EVERY} {STEP_SLEEP} "
            f"{COLLECTIVE_TIMEOUT}")


def jobwrap_script(python: str, run: str) -> str:
    """jobwrap's hooks do the restarts: the script runs the training once."""
    return f"""#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --gres=gpu:1 --output=gp-%j.out --open-mode=append
#JOBWRAP --checkpoint-dir=ckpt-{run} --max-restarts=12
export GP_RUN=$PWD/{run}
{srun(python)}
"""


def spare_script(python: str, run: str, jobwrap: str) -> str:
    """jobwrap with one spare node: the same training under ``jobwrap run`` (a rank's
    failure restarts inside the allocation) on 2 working nodes and 1 spare (a node's
    failure moves the work onto it); ``--no-kill`` keeps a lost node from ending the job."""
    return f"""#!/bin/bash
#SBATCH --nodes=2 --no-kill --ntasks-per-node=1 --gres=gpu:1 --output=gp-%j.out --open-mode=append
#JOBWRAP --checkpoint-dir=ckpt-{run} --max-restarts=12 --spare-nodes=1
export GP_RUN=$PWD/{run}
{jobwrap} run -- {srun(python)}
"""


def baseline_script(python: str, run: str) -> str:
    """Slurm alone and a diligent user: ``--requeue`` (node loss), a loop that reruns a
    failed step in place, a collective timeout for a stuck peer, and a trap that asks the
    ranks to save (srun passes SIGUSR1 on to them) and requeues the job before its time
    limit, as jobwrap's supervisor does."""
    return f"""#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --gres=gpu:1 --output=gp-%j.out --open-mode=append
#SBATCH --requeue --signal=B:USR1@50
export GP_RUN=$PWD/{run} GP_CKPT=$PWD/ckpt-{run}
trap 'echo "time limit near: save, then requeue"; kill -USR1 $step; sleep 3
      scontrol requeue $SLURM_JOB_ID; exit 0' USR1
for try in $(seq 1 20); do
    {srun(python)} &
    step=$!
    wait $step && exit 0
    echo "training failed (try $try): rerun from the newest checkpoint"
    sleep 1
done
exit 1
"""
