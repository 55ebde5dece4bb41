"""Hang forensics: every rank's Python stack and the node's GPUs, taken before a hung job ends.

When the supervisor declares a hang it writes ``hang`` to its root-owned fact channel and
waits (``[supervisor] forensics_timeout``) before ending the job. Each node's watcher sees
that fact and, as root, finds the job's processes on its node from facts the user cannot
forge: ``/proc/PID/status`` says the process is the job user's (real, effective, saved and
file-system uid alike) and ``/proc/PID/environ``, read by root, carries
``SLURM_JOB_ID=<job>``. A process of anyone else is never a candidate, whatever its
environment says. py-spy then reads each candidate's stack **with the job user's rights**
(``osl.child.call_as``: the kernel refuses it any process that is not the user's), each
dump bounded in time, the whole bounded again by the helper's deadline. The node's GPUs'
utilisation and memory come from the probe.

The watcher keeps the result as ``forensics-<node>.json`` (root's, archived with the
attempt) and a ``watch.forensics`` root event; the first node's epilog compares all
nodes' ranks (``odd_ones``) and names the rank(s) standing apart, for instance the one
not inside the collective the others wait in, in a ``hang.forensics`` root event and the
job's output.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from wrapper import log
from wrapper.job import events as ev
from wrapper.watch.files import WATCH_FORMAT, forensics_file
from wrapper.watch.procs import (
    COLLECTIVE_FILES,
    COLLECTIVE_NAMES,
    FRAME_MAX,
    MAX_FRAMES,
    _printable,
    job_processes,
    py_spy,
)


def summarise(threads: Any, pid: int) -> dict[str, Any]:
    """The main thread's frames (innermost first), its signature, and where it waits."""
    if not isinstance(threads, list) or not threads:
        return {"frames": [], "error": "no thread"}
    main = next((t for t in threads if isinstance(t, dict) and t.get("os_thread_id") == pid),
                threads[0])
    frames = [f for f in (main.get("frames") or []) if isinstance(f, dict)][:MAX_FRAMES]
    shown = [_printable(f"{f.get('name')} ({f.get('short_filename') or f.get('filename')}:"
                        f"{f.get('line')})")[:FRAME_MAX] for f in frames]
    inside = any(any(c in str(f.get("filename", "")) for c in COLLECTIVE_FILES)
                 or str(f.get("name")) in COLLECTIVE_NAMES for f in frames)
    return {"frames": shown, "signature": shown[0] if shown else "",
            "in_collective": inside, "threads": len(threads)}


def gpu_state(cfg: Any, node: str, gpus: Sequence[int]) -> list[dict[str, Any]]:
    """Utilisation and memory of the node's allocated GPUs, through the probe."""
    from wrapper.errors import JobwrapError
    from wrapper.gpu.backend import open_probe

    try:
        probe = open_probe(cfg.gpu, node)
        try:
            readings = probe.devices({"memory_used_mib", "compute_pids", "utilization_pct"})
        finally:
            probe.close()
    except JobwrapError as exc:
        return [{"error": str(exc)}]
    return [{"index": r.index, "uuid": r.uuid, "memory_used_mib": r.memory_used_mib,
             "utilization_pct": r.utilization_pct,
             "compute_pids": list(r.compute_pids or ())}
            for r in readings if r.minor in gpus]


def collect(cfg: Any, *, job_id: str, node: str, attempt: int, uid: int, gid: int,
            gpus: Sequence[int], budget: float,
            flight_folder: str | None = None) -> dict[str, Any]:
    """This node's forensics (root, in the watcher): each rank's stack, and the flight
    recorder's dumps in ``flight_folder`` (wrapper/watch/flight.py); never raises."""
    from wrapper.errors import JobwrapError
    from wrapper.osl.child import call_as
    from wrapper.osl.users import UserIds
    from wrapper.watch.ranks import describe, pick_ranks, read_as_user, where

    started = time.monotonic()
    problems: list[str] = []
    procs = job_processes(job_id, uid, node=node)
    facts = {p["pid"]: describe("/proc", p["pid"]) for p in procs}
    chosen = pick_ranks([{**p, **f} for p in procs if (f := facts[p["pid"]]) is not None])
    ranks = [p for p in procs if p["pid"] in chosen]
    got: dict[str, Any] = {}
    if ranks or flight_folder:
        try:
            user = UserIds.of(uid, gid)
            got = call_as(user, read_as_user, py_spy(), [p["pid"] for p in ranks],
                          max(1.0, budget - 2.0), flight_folder, timeout=budget)
        except JobwrapError as exc:
            problems.append(f"the stacks could not be read: {exc}")
    stacks = got.get("stacks") or {}
    out_ranks = []
    for p in ranks:
        stack = stacks.get(str(p["pid"]), {})
        entry: dict[str, Any] = {"node": node, "pid": p["pid"], "rank": p["rank"],
                                 "cmd": p["cmd"]}
        if "threads" in stack:
            entry.update(summarise(stack["threads"], p["pid"]))
            entry["in_collective"] = where(stack["threads"], p["pid"]).get("coll", False)
        else:
            entry.update({"frames": [], "error": stack.get("error", "not read")})
        out_ranks.append(entry)
    if not procs:
        problems.append("no process of the job's user carries this job's SLURM_JOB_ID here")
    result = {"node": node, "attempt": attempt, "job_id": job_id, "ranks": out_ranks,
              "flight": got.get("flight") or [],
              "gpus": gpu_state(cfg, node, gpus), "problems": problems,
              "seconds": round(time.monotonic() - started, 3)}
    log.get().info("watch.forensics", ranks=len(out_ranks), problems=len(problems),
                   flight=len(got.get("flight") or ()), folder=flight_folder,
                   seconds=result["seconds"])
    return result


def label(rank: dict[str, Any]) -> str:
    who = f"rank {rank['rank']}" if rank.get("rank") is not None else "a rank"
    return f"{who} (pid {rank.get('pid')} on {rank.get('node')}) at {rank.get('signature')}"


def odd_ones(ranks: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """The ranks whose stack stands apart, and why (pure).

    When some ranks wait inside a collective and others do not, the others are the odd
    ones (they keep the collective from completing); else those off the majority's
    innermost frame. Fewer than two stacks, or no difference: none.
    """
    read = [r for r in ranks if r.get("signature")]
    if len(read) < 2:
        return [], f"{len(read)} rank stack(s) read: nothing to compare"
    inside = [r for r in read if r.get("in_collective")]
    if inside and len(inside) < len(read):
        return [r for r in read if not r.get("in_collective")], \
            f"{len(inside)} of {len(read)} ranks wait inside a collective"
    top, count = Counter(r["signature"] for r in read).most_common(1)[0]
    if count * 2 > len(read) and count < len(read):
        return [r for r in read if r["signature"] != top], \
            f"{count} of {len(read)} ranks stand at {top}"
    return [], f"no rank's stack stands apart among {len(read)}"


class Trigger:
    """The watcher's cheap per-tick look for the supervisor's ``hang`` fact (root's channel).

    Only the channel file's size is looked at until it changes; the facts are read then."""

    def __init__(self, state: Any, attempt: int) -> None:
        self.state, self.attempt = state, attempt
        self.size = -1
        self.done = False

    def wanted(self) -> bool:
        from wrapper.job.facts import supervisor_facts
        from wrapper.job.paths import SUPERVISOR_FACTS

        if self.done:
            return False
        try:
            size = os.stat(self.state.path / SUPERVISOR_FACTS).st_size
        except OSError:
            return False
        if size == self.size:
            return False
        self.size = size
        if ev.Hang.KIND in supervisor_facts(self.state, self.attempt):
            self.done = True
            return True
        return False


def conclude(state: Any, job_id: str, attempt: int, stdout: str, user: Any) -> str | None:
    """First node's epilog: name the odd rank(s) from every node's ``watch.forensics``.

    Records ``hang.forensics`` (root) and tells the job's output; returns the message."""
    from wrapper.job.store import JobStore

    store = JobStore(state)
    found = [e for e in store.root_events()
             if isinstance(e, ev.WatchForensics) and e.attempt == attempt]
    if not found:
        return None
    from wrapper.watch.flight import not_joined

    ranks = [r for e in found for r in e.ranks if isinstance(r, dict)]
    odd, why = odd_ones(ranks)
    names = [label(r) for r in odd]
    flight, said = not_joined(r for e in found for r in e.flight if isinstance(r, dict))
    store.record(ev.HangForensics(attempt=attempt, node=found[0].node,
                                  nodes=sorted({e.node for e in found}), ranks=len(ranks),
                                  odd=names, why=why, flight=flight))
    message = ("jobwrap: hang forensics of attempt " f"{attempt}: " +
               (f"standing apart: {'; '.join(names)} ({why})" if names else why) +
               (f". PyTorch's flight recorder: {'; '.join(flight)} ({said})" if flight
                else "") +
               f". Every rank's stack is in the archive (jobwrap archive show {job_id}).")
    from wrapper.job.output import tell

    tell(stdout, user, message)
    return message


def forensics_of(state: Any, node: str) -> dict[str, Any]:
    """``{"forensics": ...}`` for this node's archive part, when its watcher took them."""
    found = state.read_json(forensics_file(node))
    if not found:
        return {}
    from wrapper.errors import format_of

    format_of(found, "format", known=WATCH_FORMAT, path=state.path / forensics_file(node),
              what="forensics record")
    return {"forensics": {k: v for k, v in found.items() if k != "format"}}
