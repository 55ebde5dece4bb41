"""The job's processes on a node, as root reads them (the forensics', the samples' and the
fence's gate), and their Python stacks read by py-spy with the job user's rights."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MAX_PROCS = 64  # candidates on one node: a user spawning thousands costs root nothing more
MAX_FRAMES = 40
LABEL_MAX = 16  # characters of a rank label taken from a process's environment
FRAME_MAX = 240  # characters of one frame's text (function and file names are the user's)
PROC_READ_MAX = 256 << 10
RANK_VARS = (b"RANK", b"PMI_RANK", b"OMPI_COMM_WORLD_RANK")  # the first set names the rank
DUMP_TIMEOUT = 5.0  # one process's dump; a process that blocks py-spy costs this, no more
# The helpers multiprocessing starts beside the ranks: never a rank.
HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver",
           "multiprocessing.semaphore_tracker")
COLLECTIVE_FILES = ("torch/distributed/", "torch/nn/parallel/distributed", "deepspeed/comm",
                    "mpi4py", "horovod", "jax/_src/distributed")
COLLECTIVE_NAMES = frozenset({"all_reduce", "allreduce", "all_gather", "allgather",
                              "broadcast", "barrier", "reduce_scatter", "all_to_all",
                              "alltoall", "monitored_barrier", "wait"})


def _read_proc(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return os.read(fd, PROC_READ_MAX)
    finally:
        os.close(fd)


def job_processes(job_id: str, uid: int, proc: str = "/proc", *, node: str | None = None,
                  limit: int | None = MAX_PROCS) -> list[dict[str, Any]]:
    """The job user's processes on this node whose environment names ``job_id`` (and,
    with ``node``, no other node as ``SLURMD_NODENAME``: the sandbox's nodes share one
    host); at most ``limit`` (None: all, as the pulse's fence needs)."""
    found: list[dict[str, Any]] = []
    try:
        entries = sorted(int(e) for e in os.listdir(proc) if e.isdigit())
    except OSError:
        return []
    want = f"SLURM_JOB_ID={job_id}".encode()
    for pid in entries:
        try:
            status = _read_proc(f"{proc}/{pid}/status").decode("ascii", "replace")
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            uids = {int(u) for u in fields.get("Uid", "").split()}
            if uids != {uid}:  # anyone else's (or a setuid one's): never a candidate
                continue
            env = _read_proc(f"{proc}/{pid}/environ").split(b"\0")
            if want not in env or (node is not None and any(
                    v.startswith(b"SLURMD_NODENAME=") and v != b"SLURMD_NODENAME=" + node.encode()
                    for v in env)):
                continue
            argv = _read_proc(f"{proc}/{pid}/cmdline")[:4096]
        except (OSError, ValueError):
            continue  # gone, or not readable: not a candidate
        values = dict(v.split(b"=", 1) for v in env if b"=" in v)
        var = next((k for k in RANK_VARS if k in values), None)
        cmd = argv.replace(b"\0", b" ")
        found.append({"pid": pid, "ppid": int(fields.get("PPid", "0").strip() or 0),
                      "rank": rank_label(values[var]) if var else None,
                      # the rank variable as NAME=value (the samples' picking), raw argv
                      "label": (var + b"=" + values[var])[:64].decode("ascii", "replace")
                      if var else "", "argv": argv,
                      "cmd": _printable(cmd[:800].decode(errors="replace").strip())[:200]})
        if limit is not None and len(found) >= limit:
            break
    return found


def rank_label(raw: bytes) -> str:
    """A rank's label from its environment (the user's text): a number as it is, anything
    else cut to ``LABEL_MAX`` printable characters, so that no process's environment can
    grow root's events (64 processes with a 128 KiB RANK once wrote an 8 MiB line)."""
    text = raw[:LABEL_MAX * 4].decode("utf-8", "replace")
    if text.isdigit() and len(text) <= LABEL_MAX:
        return text
    shown = "".join(c if c.isprintable() else "?" for c in text[:LABEL_MAX])
    return repr(shown) + ("..." if len(text) > LABEL_MAX else "")


def py_spy() -> str:
    """The py-spy installed beside jobwrap's Python (a dependency of jobwrap)."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside)


def dump_stacks(binary: str, pids: Sequence[int], deadline_s: float) -> dict[str, Any]:
    """Run as the job's user: ``{pid: py-spy's JSON or {"error": ...}}``, each bounded."""
    import json
    import subprocess

    end = time.monotonic() + deadline_s
    out: dict[str, Any] = {}
    for pid in pids:
        left = end - time.monotonic()
        if left <= 0.2:
            out[str(pid)] = {"error": "no time left for this process"}
            continue
        try:
            done = subprocess.run([binary, "dump", "--pid", str(pid), "--json", "--nonblocking"],
                                  capture_output=True, timeout=min(DUMP_TIMEOUT, left),
                                  env={"PATH": "/usr/bin:/bin"}, cwd="/", check=False)
        except subprocess.TimeoutExpired:
            out[str(pid)] = {"error": f"py-spy did not answer within {DUMP_TIMEOUT:g} s"}
            continue
        except OSError as exc:
            out[str(pid)] = {"error": f"py-spy cannot run: {exc.strerror}"}
            continue
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip().splitlines()
            out[str(pid)] = {"error": (why[0] if why else f"exit {done.returncode}")[:200]}
            continue
        try:
            out[str(pid)] = {"threads": json.loads(done.stdout[:1 << 20])}
        except ValueError:
            out[str(pid)] = {"error": "py-spy's output was not JSON"}
    return out


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)
