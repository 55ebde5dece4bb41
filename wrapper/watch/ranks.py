"""A node's sample of its job's ranks: where each one is, and whether it moves.

Every ``[pulse] sample_interval`` the node's watcher (root) finds the job's ranks on its
node from facts the user cannot forge (wrapper.watch.forensics.job_processes: the job
user's processes whose environment names the job and this node), reads what the kernel
counts for each (CPU time, bytes read and written, whether a thread waits on storage,
summed over the rank and its helpers) and reads each rank's Python stack with py-spy **as
the job's user** (``--nonblocking``: the rank is never paused), in the same child as the
flight recorder's dumps the node's ranks wrote, if any (``fr``, wrapper/watch/flight.py).
The sample travels to the
job's first node over the pulse (wrapper/pulse/beat.py), where wrapper/pulse/judge.py
judges the job's ranks together.

Which processes are ranks (``pick_ranks``), on what the kernel says about them:

- Python processes only (their executable's name says python): a shell, ``srun`` or a
  ``sleep`` is never a rank, and has no Python stack to read.
- A process that carries a distributed rank in its environment (``RANK``, ``PMI_RANK``,
  ``OMPI_COMM_WORLD_RANK``) is the rank of that number when no ancestor of it carries the
  same one; its descendants that do (DataLoader workers, compile workers) are its
  helpers, and their CPU and I/O count as the rank's.
- A job where no process carries one (``torch.multiprocessing.spawn`` passes the rank as
  an argument): the Python processes without a Python child (the spawned ranks, not
  their launcher), minus fork children that run their parent's command line
  (DataLoader workers) and multiprocessing's helpers.
- A launcher (``torchrun``'s agent, which carries no rank, or spawn's parent) is never a
  rank: it waits by design.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from typing import Any

from wrapper.watch.procs import COLLECTIVE_FILES, COLLECTIVE_NAMES, FRAME_MAX, HELPERS

PROCS_MAX = 512  # the job's processes looked at on one node, at most
RANKS_MAX = 64  # ranks sampled on one node, at most (their stacks cost ~7 ms of CPU each)
FLIGHT_BYTES = 16 << 10  # of a sample's flight-recorder summaries (the beat carries 64 KiB)
# Where DDP waits for its gradients' all-reduce: the main thread, idle inside autograd's
# backward (the reducer's collective runs from C++; the Python stack shows backward only).
BACKWARD_FILES = ("torch/autograd/graph.py", "torch/autograd/__init__.py")
# A rank still meeting its peers (init_process_group's rendezvous) is starting, not
# waiting in a collective: a peer slow to start is no hang.
STARTING_NAMES = frozenset({"init_process_group", "_store_based_barrier", "rendezvous",
                            "_create_c10d_store", "_env_rendezvous_handler",
                            "_tcp_rendezvous_handler", "next_rendezvous"})
# Named like a collective: a frame of the user's own code or of a framework outside
# COLLECTIVE_FILES. Not "wait": threading's and multiprocessing's waits are everywhere a
# rank waits for anything (its data loader's queue).
WAIT_NAMES = COLLECTIVE_NAMES - {"wait"}
HELPER_CMDS = (*HELPERS, "torch._inductor.compile_worker", "torch/_inductor/compile_worker")
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read(path: str, limit: int = 65536) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def describe(proc_root: str, pid: int) -> dict[str, Any] | None:
    """What root reads of one job process for the sample, beyond what ``job_processes``
    read (its rank variable, its command line): its executable's name, CPU seconds, bytes
    read and written, whether a thread of it waits on storage (state D), and its main
    thread's time on a CPU plus waiting for one (``busy``: schedstat's run time and run
    delay, which a CPU quota's throttling adds to). None when it is gone."""
    base = f"{proc_root}/{pid}"
    try:
        exe = os.path.basename(os.readlink(f"{base}/exe"))
    except OSError:
        exe = ""
    try:
        stat = _read(f"{base}/stat", 4096).decode("ascii", "replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        cpu = (int(fields[11]) + int(fields[12])) / TICK
    except (IndexError, ValueError):
        cpu = 0.0
    io = 0
    try:
        for line in _read(f"{base}/io", 4096).decode("ascii", "replace").splitlines():
            if line.startswith(("rchar:", "wchar:")):
                io += int(line.split()[1])
    except (OSError, ValueError):
        pass
    busy = 0.0
    try:
        run_ns, delay_ns = _read(f"{base}/schedstat", 256).split()[:2]
        busy = (int(run_ns) + int(delay_ns)) / 1e9
    except (OSError, ValueError):
        pass
    waits_on_storage = fields[:1] == ["D"] or _a_thread_in_d(base)
    return {"exe": exe, "cpu": cpu, "io": io, "d": waits_on_storage, "busy": busy}


def _a_thread_in_d(base: str) -> bool:
    """Whether a thread of the process waits on storage (an uninterruptible sleep)."""
    try:
        tids = os.listdir(f"{base}/task")
    except OSError:
        return False
    for tid in tids[:256]:
        try:
            stat = _read(f"{base}/task/{tid}/stat", 4096).decode("ascii", "replace")
        except OSError:
            continue
        if stat[stat.rfind(")") + 2:][:1] == "D":
            return True
    return False


def pick_ranks(procs: Sequence[dict[str, Any]]) -> dict[int, list[int]]:
    """``{rank pid: [its helpers' pids]}`` among ``procs`` (each with ``pid``, ``ppid``,
    ``exe``, ``label``, ``argv``); pure (see the module's doc)."""
    by_pid = {p["pid"]: p for p in procs}
    python = {p["pid"] for p in procs if "python" in p["exe"]}

    def ancestors(pid: int) -> list[int]:
        out, seen = [], {pid}
        parent = by_pid[pid]["ppid"]
        while parent in by_pid and parent not in seen:
            out.append(parent)
            seen.add(parent)
            parent = by_pid[parent]["ppid"]
        return out

    ranks: dict[int, list[int]] = {}
    labelled = [pid for pid in python if by_pid[pid]["label"]]
    if labelled:
        for pid in sorted(labelled):
            label = by_pid[pid]["label"]
            if not any(by_pid[a]["label"] == label for a in ancestors(pid)):
                ranks[pid] = []
    else:
        def helper(pid: int) -> bool:
            p = by_pid[pid]
            parent = by_pid.get(p["ppid"])
            cmd = p["argv"].replace(b"\0", b" ").decode(errors="replace")
            return any(h in cmd for h in HELPER_CMDS) or (
                parent is not None and p["ppid"] in python and parent["argv"] == p["argv"])

        helpers = {pid for pid in python if helper(pid)}
        for pid in sorted(python - helpers):
            children = {c for c in python - helpers if by_pid[c]["ppid"] == pid}
            if not children:
                ranks[pid] = []
    for p in procs:  # every other job process belongs to its nearest rank ancestor
        if p["pid"] in ranks:
            continue
        owner = next((a for a in ancestors(p["pid"]) if a in ranks), None)
        if owner is not None:
            ranks[owner].append(p["pid"])
    return dict(sorted(ranks.items())[:RANKS_MAX])


def where(threads: Any, pid: int) -> dict[str, Any]:
    """From py-spy's JSON: whether the main thread waits in a collective, whether it was on
    a CPU, its innermost frame, and a signature of its whole stack (for "it moved")."""
    if not isinstance(threads, list) or not threads:
        return {"err": "no thread"}
    main = next((t for t in threads if isinstance(t, dict) and t.get("os_thread_id") == pid),
                threads[0])
    frames = [f for f in (main.get("frames") or []) if isinstance(f, dict)][:40]
    idle = not main.get("active", True)
    files = [str(f.get("filename", "")) for f in frames]
    names = [str(f.get("name", "")) for f in frames]
    coll = any(any(c in fn for c in COLLECTIVE_FILES) for fn in files) or \
        any(n in WAIT_NAMES for n in names) or \
        (idle and any(any(b in fn for b in BACKWARD_FILES) for fn in files))
    if any(n in STARTING_NAMES for n in names):
        coll = False
    text = [f"{f.get('name')} ({f.get('short_filename') or f.get('filename')}:{f.get('line')})"
            for f in frames]
    sig = hashlib.blake2b("\n".join(text).encode(errors="replace"), digest_size=6).hexdigest()
    at = "".join(c if c.isprintable() else "?" for c in (text[0] if text else ""))[:FRAME_MAX]
    return {"coll": coll, "idle": idle, "sig": sig, "at": at}


def _bounded(records: list[Any], limit: int) -> list[Any]:
    """The first ``records`` whose JSON fits ``limit`` bytes: the flight recorder's part
    of a sample never pushes the sample past what the beat carries."""
    import json

    out, size = [], 0
    for record in records:
        size += len(json.dumps(record, separators=(",", ":"))) + 1
        if size > limit:
            break
        out.append(record)
    return out


def read_as_user(spy: str, pids: list[int], budget: float,
                 flight_folder: str | None) -> dict[str, Any]:
    """In a child as the job's user: the ranks' stacks (py-spy) and the flight recorder's
    dumps the node's ranks wrote (wrapper/watch/flight.py), both the user's to read."""
    from wrapper.watch.flight import read_folder
    from wrapper.watch.procs import dump_stacks

    return {"stacks": dump_stacks(spy, pids, budget) if pids else {},
            "flight": read_folder(flight_folder) if flight_folder else []}


class NodeSampler:
    """One node's sampler: ``sample()`` is called by the watcher's sampling thread."""

    def __init__(self, *, job_id: str, node: str, uid: int, gid: int,
                 proc_root: str = "/proc", flight_folder: str | None = None) -> None:
        self.job_id, self.node, self.uid, self.gid = job_id, node, uid, gid
        self.proc_root = proc_root
        self.flight_folder = flight_folder  # where the node's ranks dump their recorder
        self.spent = 0.0  # CPU seconds this sampler's stack readers cost (children)

    def sample(self, budget: float) -> dict[str, Any]:
        """This node's sample, read within about ``budget`` seconds; never raises."""
        from wrapper.errors import JobwrapError
        from wrapper.osl.child import call_as
        from wrapper.osl.users import UserIds
        from wrapper.watch.procs import job_processes, py_spy

        now = time.time()
        found = job_processes(self.job_id, self.uid, self.proc_root, node=self.node,
                              limit=PROCS_MAX)
        procs = []
        for p in found:
            facts = describe(self.proc_root, p["pid"])
            if facts is not None:
                procs.append({**p, **facts})
        by_pid = {p["pid"]: p for p in procs}
        ranks = pick_ranks(procs)
        got: dict[str, Any] = {}
        error = ""
        if ranks:
            before = os.times()
            try:
                got = call_as(UserIds.of(self.uid, self.gid), read_as_user, py_spy(),
                              list(ranks), max(0.5, budget - 0.5), self.flight_folder,
                              timeout=budget + 1.0)
            except JobwrapError as exc:
                error = str(exc)[:200]
            after = os.times()
            self.spent += (after.children_user - before.children_user) + \
                (after.children_system - before.children_system)
        stacks = got.get("stacks") or {}
        out = []
        for pid, helpers in ranks.items():
            group = [by_pid[pid], *(by_pid[h] for h in helpers if h in by_pid)]
            entry: dict[str, Any] = {
                "pid": pid, "rank": by_pid[pid]["rank"] or "",
                "cpu": round(sum(g["cpu"] for g in group), 2),
                "io": sum(g["io"] for g in group), "d": any(g["d"] for g in group),
                "busy": round(by_pid[pid]["busy"], 3)}
            stack = stacks.get(str(pid), {})
            if "threads" in stack:
                entry.update(where(stack["threads"], pid))
            else:
                entry["err"] = str(stack.get("error", error or "not read"))[:120]
            out.append(entry)
        sample: dict[str, Any] = {"node": self.node, "t": round(now, 3), "ranks": out}
        if got.get("flight"):
            sample["fr"] = _bounded(got["flight"][:RANKS_MAX], FLIGHT_BYTES)
        return sample
