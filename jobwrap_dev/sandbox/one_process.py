"""A one-process job with no collective: ``python3 one_process.py SECONDS``.

It waits SECONDS in one function, printing a line every 8 s (the sandbox's supervisor
calls 40 s of silence a hang; this job's output says it is alive)."""

import sys
import time


def work(seconds: float) -> None:
    end = time.time() + seconds
    while time.time() < end:
        time.sleep(8)
        print("one process at", time.time(), flush=True)


work(float(sys.argv[1]))
print("one process done", flush=True)
