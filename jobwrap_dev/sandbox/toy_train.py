"""A toy training loop for the restart tests: no torch, same contract as a real one.

Each step adds the step number to a running sum and writes a checkpoint atomically
(a zip named like Lightning's, holding the step and the sum); on start it resumes from
JOBWRAP_RESUME_FROM. An uninterrupted run of N steps ends with sum N*(N+1)/2: any lost
or repeated step shows in the final line. CRASH_AT=K with CRASH_HOW makes the first
attempt fail at step K: exit, kill (SIGKILL), hang (SIGSTOP), truncate (cut the newest
checkpoint, then exit), always (exit at the first step of every attempt), poison (write
a checkpoint that loads but crashes the resume, then exit). TOY_PEER_DIR makes it one
rank of a job in lockstep, as a collective would: each step after its first waits until
the peer (the other rank, writing there) has saved the step before. The two ranks also
hold a TCP connection on loopback, met through a rendezvous file in rank 0's checkpoint
folder as torch's stores do: a peer that dies closes it, and the rank left fails at once
with gloo's words, as gloo and NCCL fail a collective whose peer is gone. A peer that is
stopped (SIGSTOP) keeps it open: the rank left waits, a hang.
"""

import contextlib
import json
import os
import select
import signal
import socket
import sys
import time
import zipfile

RENDEZVOUS_TIMEOUT = 120.0  # seconds; torch's default store timeout is longer (300 s)


class PeerLink:
    """The connection to the other rank; ``gone()`` is true once it died mid-run."""

    def __init__(self, own_dir: str, peer_dir: str) -> None:
        name = f".toy-rdzv-{os.environ.get('SLURM_JOB_ID', '0')}." \
               f"{os.environ.get('SLURM_STEP_ID', '0')}"
        self.finished = False
        deadline = time.monotonic() + RENDEZVOUS_TIMEOUT
        if os.environ.get("SLURM_PROCID", "0") == "0":
            path = os.path.join(own_dir, name)
            server = socket.create_server(("127.0.0.1", 0))
            server.settimeout(RENDEZVOUS_TIMEOUT)
            with open(path + ".tmp", "w") as handle:
                handle.write(str(server.getsockname()[1]))
            os.replace(path + ".tmp", path)
            try:
                self.sock, _ = server.accept()
            except TimeoutError:
                fail("[gloo] Timed out waiting for the peer to connect")
            finally:
                server.close()
                os.unlink(path)
        else:
            path = os.path.join(peer_dir, name)
            while True:
                try:
                    with open(path) as handle:
                        port = int(handle.read())
                    self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                    break
                except (OSError, ValueError):
                    if time.monotonic() > deadline:
                        fail("[gloo] Timed out connecting to rank 0")
                    time.sleep(0.05)
        self.port = self.sock.getpeername()[1]

    def gone(self) -> bool:
        """True when the peer closed the link without saying it finished."""
        if self.finished:
            return False
        readable, _, _ = select.select([self.sock], [], [], 0)
        if not readable:
            return False
        try:
            data = self.sock.recv(16)
        except OSError:
            data = b""
        if data.startswith(b"done"):
            self.finished = True
            return False
        return True

    def check(self) -> None:
        if self.gone():
            fail(f"[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed "
                 f"by peer [127.0.0.1]:{self.port}")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.sendall(b"done")
        self.sock.close()


def fail(message: str) -> None:
    print(f"RuntimeError: {message}", flush=True)
    sys.exit(1)


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
    link = PeerLink(ckdir, peer) if peer else None
    for step in range(start + 1, steps + 1):
        while peer and step > start + 1 and not os.path.exists(
                os.path.join(peer, f"epoch=0-step={step - 1}.ckpt")):
            if link is not None:
                link.check()  # a peer that died fails the collective at once
            time.sleep(0.05)  # the peer is behind (or stopped): wait, as a collective does
        if link is not None:
            link.check()
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
    if link is not None:
        link.close()
    print(f"done sum {total}", flush=True)


if __name__ == "__main__":
    main()
