"""What the job's first node learns of faults on its other nodes, from root's sources only.

A node's watcher drains its node with the fault's reason before it ends the job, so by the
time the first node's epilog decides, Slurm already shows it: a node of this job that is
drained (or draining) with a ``jobwrap:`` reason. Root's own ``watch.fault`` events (in a
state folder the nodes share) say the same where they are visible. The job's user can
neither set a node's state in Slurm nor write root's events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from wrapper import log
from wrapper.errors import JobwrapError
from wrapper.job import events as ev
from wrapper.slurm import SlurmBackend


def faults_elsewhere(backend: SlurmBackend, nodes: Sequence[str], here: str, attempt: int,
                     root_events: Iterable[dict[str, Any]],
                     records: Mapping[str, dict[str, str]] | None = None) -> dict[str, str]:
    """``{node: drain reason}`` for the job's other nodes a fault ended this attempt on.
    ``records``: Slurm's node records already read (else asked here, in one call)."""
    found: dict[str, str] = {}
    for e in root_events:
        node = str(e.get("node", ""))
        if e.get("event") == ev.WatchFault.KIND and e.get("attempt") == attempt and node != here \
                and node in nodes:
            found[node] = str(e.get("reason", "a GPU fault"))
    rest = [n for n in nodes if n not in found]
    pairs = [(n, records[n]) for n in rest if n in records and n != here] \
        if records is not None else node_records(backend, rest, here)
    for node, info in pairs:
        reason = info.get("Reason", "")
        if "DRAIN" in info.get("State", "").upper() and reason.startswith("jobwrap:"):
            found[node] = reason.split(" [", 1)[0]  # Slurm appends " [user@time]"
    return found


def node_records(backend: SlurmBackend, nodes: Sequence[str], here: str
                 ) -> Iterable[tuple[str, dict[str, str]]]:
    """Slurm's record of each of ``nodes`` but ``here``, asked in one call (unreadable:
    logged, none; a node missing from the answer: skipped)."""
    wanted = [n for n in nodes if n != here]
    if not wanted:
        return []
    try:
        found = backend.nodes_info(wanted)
    except JobwrapError as exc:
        log.get().warning("watch.node_unreadable", node=",".join(wanted)[:200], error=str(exc))
        return []
    return [(n, found[n]) for n in wanted if n in found]
