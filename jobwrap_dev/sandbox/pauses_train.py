"""A gloo DDP job (torch, CPU) with long pauses that are not hangs, then a real hang.

``python pauses_train.py PHASE STUCK [STEPS]``, one process per rank, with ``RANK``,
``WORLD_SIZE`` and ``PORT`` (the rendezvous on 127.0.0.1) in its environment.

After 5 steps, when PHASE > 0, four pauses of PHASE seconds each that a hang judge must
not call hangs: rank 0 writes a checkpoint while the others wait at a barrier; rank 0's
first step "compiles" (Python on a CPU); rank 0 evaluates; every rank waits on its data
loader. Then rank STUCK (-1: none) stops for good before its next all-reduce, once per
job (a marker file in the working folder): a command restarted in place after the hang
skips the pauses and the hang, and trains STEPS steps (0: for ever). Rank 0 prints each
step with the time, and each phase as it starts: ``rank R: NAME at T``.

``TRAIN_WIDTH`` (16) and ``TRAIN_SLEEP`` (0.2 s after each step) shape a step: a wide one
without sleep (a batch of 2,048) keeps every rank on its CPU (the slow-node tests); then
every 100th step is printed.

``FR_DUMP_AFTER`` (s, off by default): once no step has ended for that long, each rank
writes PyTorch's flight recorder to ``TORCH_FR_DUMP_TEMP_FILE`` + its rank, once, as
NCCL's watchdog does on a collective's timeout (gloo has no such watchdog).
"""

import os
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

PHASE, STUCK = float(sys.argv[1]), int(sys.argv[2])
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 0
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"],
                        rank=rank, world_size=world)
WIDTH = int(os.environ.get("TRAIN_WIDTH", "16"))
PAUSE = float(os.environ.get("TRAIN_SLEEP", "0.2"))
model = DistributedDataParallel(torch.nn.Linear(WIDTH, WIDTH))
marker = f"stuck-{os.environ.get('SLURM_JOB_ID', 'local')}"
step = 0


def say(what: str) -> None:
    print(f"rank {rank}: {what} at {time.time():.3f}", flush=True)


last_step = time.monotonic()


def train(steps: int) -> None:
    global step, last_step
    for _ in range(steps):
        model(torch.randn(8 if PAUSE else 2048, WIDTH)).sum().backward()
        step += 1
        last_step = time.monotonic()
        if rank == 0 and (PAUSE or step % 100 == 0):
            print(f"step {step} at {time.time():.3f}", flush=True)
        time.sleep(PAUSE)


class SlowStorage(torch.utils.data.Dataset):  # type: ignore[misc]  # first item after PHASE s
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(PHASE if i == 0 else 0)
        return torch.randn(WIDTH)


def write_checkpoint() -> None:
    with open(f"ckpt-{os.environ.get('SLURM_JOB_ID', 'local')}.bin", "wb") as f:
        end = time.time() + PHASE
        while time.time() < end:
            f.write(os.urandom(1 << 20))
            f.flush()
            time.sleep(0.5)


def compile_first_step() -> None:
    end, n = time.time() + PHASE, 0
    while time.time() < end:
        n += sum(i * i for i in range(1000))


def evaluate() -> None:
    end = time.time() + PHASE
    with torch.no_grad():
        while time.time() < end:
            model.module(torch.randn(64, WIDTH))


def dump_when_stalled(after: float) -> None:
    while time.monotonic() - last_step < after:
        time.sleep(0.5)
    from torch._C._distributed_c10d import _dump_fr_trace

    with open(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank), "wb") as f:
        f.write(_dump_fr_trace(True, True, False))
    say("flight recorder dumped")


resumed = os.path.exists(marker)
if resumed:
    say("resumed")
train(5)
if float(os.environ.get("FR_DUMP_AFTER", "0")) > 0 and "TORCH_FR_DUMP_TEMP_FILE" in os.environ:
    threading.Thread(target=dump_when_stalled, args=(float(os.environ["FR_DUMP_AFTER"]),),
                     daemon=True).start()
if PHASE > 0 and not resumed:
    for name, work in (("checkpoint", write_checkpoint), ("compile", compile_first_step),
                       ("evaluate", evaluate)):
        say(name)
        if rank == 0:
            work()
        dist.barrier()
        train(3)
    say("loader")
    for _batch in torch.utils.data.DataLoader(SlowStorage(), batch_size=4, num_workers=1):
        pass
    train(3)
    say("pauses over")
if rank == STUCK and not resumed:
    open(marker, "w").close()
    say("stuck")
    time.sleep(1e6)  # the others wait in the next all-reduce
train(STEPS if STEPS else 10**9)
say("done")
dist.destroy_process_group()
