"""A toy training loop for the restart tests: no torch, same contract as a real one.

Each step adds the step number to a running sum and writes a checkpoint atomically
(a zip named like Lightning's, holding the step and the sum); on start it resumes from
JOBWRAP_RESUME_FROM. An uninterrupted run of N steps ends with sum N*(N+1)/2: any lost
or repeated step shows in the final line. CRASH_AT=K with CRASH_HOW makes the first
attempt fail at step K: exit, kill (SIGKILL), hang (SIGSTOP), truncate (cut the newest
checkpoint, then exit), always (exit at the first step of every attempt), poison (write
a checkpoint that loads but crashes the resume, then exit). TOY_PEER_DIR makes it one
rank of a job in lockstep, as a collective would: each step after its first waits until
the peer (the other rank, writing there) has saved the step before.
"""

import json
import os
import signal
import sys
import time
import zipfile


def main() -> None:
    steps = int(sys.argv[1])
    delay = float(sys.argv[2]) if len(sys.argv) > 2 else 0.3
    ckdir = os.environ["JOBWRAP_CHECKPOINT_DIR"]
    attempt = os.environ.get("JOBWRAP_ATTEMPT", "?")
    resume = os.environ.get("JOBWRAP_RESUME_FROM")
    crash_at = int(os.environ.get("CRASH_AT", "0"))
    crash_how = os.environ.get("CRASH_HOW", "exit")
    os.makedirs(ckdir, exist_ok=True)
    start, total = 0, 0
    if resume:
        with zipfile.ZipFile(resume) as archive:
            saved = json.loads(archive.read("state.json"))
        if saved.get("poison"):
            raise ValueError(f"poisoned checkpoint {resume}")
        start, total = saved["step"], saved["sum"]
    print(f"attempt={attempt} resume={resume} start={start}", flush=True)
    peer = os.environ.get("TOY_PEER_DIR")
    for step in range(start + 1, steps + 1):
        while peer and step > start + 1 and not os.path.exists(
                os.path.join(peer, f"epoch=0-step={step - 1}.ckpt")):
            time.sleep(0.05)  # the peer is behind (or gone): wait, as a collective does
        total += step
        final = os.path.join(ckdir, f"epoch=0-step={step}.ckpt")
        tmp = os.path.join(ckdir, f".step={step}.ckpt.tmp")
        with zipfile.ZipFile(tmp, "w") as archive:
            poison = crash_how == "poison" and step == crash_at and attempt == "0"
            archive.writestr("state.json", json.dumps({"step": step, "sum": total,
                                                       "poison": poison}))
            archive.writestr("weights.bin", os.urandom(4096))
        os.replace(tmp, final)
        print(f"step {step} sum {total}", flush=True)
        first_attempt_crash = step == crash_at and attempt == "0"
        every_attempt_crash = crash_how == "always" and step == max(crash_at, start + 1)
        if first_attempt_crash or every_attempt_crash:
            print(f"crashing: {crash_how}", flush=True)
            if crash_how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif crash_how == "hang":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif crash_how == "truncate":
                size = os.path.getsize(final)
                with open(final, "r+b") as handle:
                    handle.truncate(size // 2)
                sys.exit(3)
            else:
                print("RuntimeError: loss is nan at step", step, flush=True)
                sys.exit(3)
        time.sleep(delay)
    print(f"done sum {total}", flush=True)


if __name__ == "__main__":
    main()
