"""The first node's decision, told of what happened on the job's other nodes, from root's
sources only: faults a watcher found there, nodes Slurm lost.

A node's watcher drains its node with the fault's reason before it ends the job, so by the
time the first node's epilog decides, Slurm already shows it: a node of this job that is
drained (or draining) with a ``jobwrap:`` reason. Root's own ``watch.fault`` events (in a
state folder the nodes share) say the same where they are visible. The job's user can
neither set a node's state in Slurm nor write root's events.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from wrapper import log
from wrapper.errors import JobwrapError
from wrapper.job import events as ev
from wrapper.job.events import PrologContext
from wrapper.restart.classify import HARDWARE, NODE_FAILURE, SUCCESS
from wrapper.restart.judge import Remote
from wrapper.slurm import SlurmBackend
from wrapper.slurm.context import JobContext

# Seconds between asks of Slurm's accounting for the attempt's end (it arrives after the
# requeue): at most about 3 s, and only when a node's slurmd restarted during the attempt.
ACCOUNTING_WAITS = (0.5, 1.0, 1.5)


def gather(backend: SlurmBackend, ctx: JobContext, root_events: Iterable[ev.Event],
           slurm_job: Mapping[str, str], kind: str) -> Remote:
    """What the job's other nodes say, for the judge (``wrapper.restart.judge``): the
    nodes Slurm lost, and the nodes a watcher found a GPU fault on, asked only where they
    can change the attempt's class ``kind`` (this node's own): not for a hardware fault
    here, a real success (Slurm's exit not a signal: a post-job check drained a node
    after the work was done) or a one-node job.

    A watcher ends the job with a signal, which the epilog's environment does not show
    (exit 0): Slurm's ``ExitCode`` (``0:15``) does."""
    root_events = list(root_events)
    started = [e.ts for e in root_events
               if isinstance(e, PrologContext) and e.attempt == ctx.attempt and e.ts]
    lost = lost_nodes(backend, ctx, slurm_job, since=min(started, default=None))
    if lost and kind not in (HARDWARE, NODE_FAILURE):
        return Remote(lost=lost)
    signalled = not slurm_job.get("ExitCode", "0:0").endswith(":0")
    if kind == HARDWARE or (kind == SUCCESS and not signalled) or len(ctx.nodes) < 2:
        return Remote(lost=lost if kind == NODE_FAILURE else {})
    return Remote(lost=lost if kind == NODE_FAILURE else {},
                  faults=faults_elsewhere(backend, ctx.nodes, ctx.node, ctx.attempt,
                                          root_events))


def lost_nodes(backend: SlurmBackend, ctx: JobContext, slurm_job: Mapping[str, str], *,
               since: float | None = None, sleep: Callable[[float], None] = time.sleep
               ) -> dict[str, str]:
    """``{node: Slurm's state and reason}`` for the job's other nodes Slurm lost, asked only
    when Slurm already ended the attempt by itself: a node failure (NODE_FAIL, or the job
    already requeued while this surviving node's epilog runs, which otherwise looks like
    an exit 0). ``since``: the attempt's start (root's prolog record).

    A node is lost when Slurm's record says DOWN or not responding, or when the node
    booted after the attempt began (lost and back). A slurmd that only restarted is no
    loss: the job's steps outlive it, and a job that then requeues itself (its own
    ``scontrol requeue``, the save before the time limit) must not make it one, or the
    user would choose when nodes count as failed. It counts only when Slurm itself ended
    the attempt as NODE_FAIL: its record, or its accounting of a requeued attempt."""
    from wrapper.restart.requeued import requeued_without_jobwrap
    from wrapper.slurm.records import SlurmJob, node_down, node_rebooted, slurmd_restarted

    job = SlurmJob.of(slurm_job)
    if len(ctx.nodes) < 2 or not (job.final_state == "NODE_FAIL"
                                  or requeued_without_jobwrap(ctx.attempt, job)):
        return {}
    found: dict[str, str] = {}
    restarted: dict[str, str] = {}
    for node, info in node_records(backend, ctx.nodes, ctx.node):
        state = info.get("State", "")
        if node_down(info):
            reason = info.get("Reason", "").split(" [", 1)[0]
            found[node] = state + (f" ({reason})" if reason else "")
        elif since is not None and node_rebooted(info, since):
            found[node] = (f"{state}, back: it booted again at {info.get('BootTime', '?')}, "
                           "during the attempt")
        elif since is not None and slurmd_restarted(info, since):
            restarted[node] = (f"{state}, back: its slurmd started again at "
                               f"{info.get('SlurmdStartTime', '?')}, during the attempt, "
                               "and Slurm ended the attempt as NODE_FAIL")
    # only when no node Slurm shows lost explains the NODE_FAIL: a rolling restart on one
    # node is not blamed for another node's real loss
    if restarted and not found and since is not None and (
            job.final_state == "NODE_FAIL" or _accounted_node_fail(backend, ctx, since, sleep)):
        found.update(restarted)
    return found


def _accounted_node_fail(backend: SlurmBackend, ctx: JobContext, since: float,
                         sleep: Callable[[float], None]) -> bool:
    """Slurm's accounting has an attempt of the job that ended as NODE_FAIL after
    ``since``; asked a few times, as slurmctld sends the record to slurmdbd after it
    requeues the job. No accounting (or no answer): False, a restart stays a restart."""
    for wait in (0.0, *ACCOUNTING_WAITS):
        if wait:
            sleep(wait)
        try:
            attempts = backend.ended_attempts(ctx.job_id)
        except JobwrapError as exc:
            log.get().warning("epilog.accounting_unavailable", error=str(exc)[:300])
            return False
        ended = [(state, end) for state, end in attempts if end is not None and end >= since]
        if ended:
            return any(state == "NODE_FAIL" for state, _ in ended)
    return False


def faults_elsewhere(backend: SlurmBackend, nodes: Sequence[str], here: str, attempt: int,
                     root_events: Iterable[ev.Event],
                     records: Mapping[str, dict[str, str]] | None = None) -> dict[str, str]:
    """``{node: drain reason}`` for the job's other nodes a fault ended this attempt on.
    ``records``: Slurm's node records already read (else asked here, in one call)."""
    found: dict[str, str] = {}
    for e in root_events:
        if isinstance(e, ev.WatchFault) and e.attempt == attempt and e.node != here \
                and e.node in nodes:
            found[e.node] = e.reason or "a GPU fault"
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
