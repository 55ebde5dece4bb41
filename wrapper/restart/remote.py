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
# requeue): at most about 3 s, and only when a node's slurmd restarted or the node booted
# during the attempt; never past the epilog's deadline.
ACCOUNTING_WAITS = (0.5, 1.0, 1.5)
ACCOUNTING_MIN_ASK = 1.0  # seconds: an ask with less left before the deadline is not made


def gather(backend: SlurmBackend, ctx: JobContext, root_events: Iterable[ev.Event],
           slurm_job: Mapping[str, str], kind: str, *, deadline: float | None = None
           ) -> Remote:
    """What the job's other nodes say, for the judge (``wrapper.restart.judge``): the
    nodes Slurm lost, and the nodes a watcher found a GPU fault on, asked only where they
    can change the attempt's class ``kind`` (this node's own): not for a hardware fault
    here, a real success (Slurm's exit not a signal: a post-job check drained a node
    after the work was done) or a one-node job.

    A watcher ends the job with a signal, which the epilog's environment does not show
    (exit 0): Slurm's ``ExitCode`` (``0:15``) does. ``deadline``: the epilog's
    (``time.monotonic``), which asking Slurm's accounting never runs past."""
    root_events = list(root_events)
    started = [e.ts for e in root_events
               if isinstance(e, PrologContext) and e.attempt == ctx.attempt and e.ts]
    lost = lost_nodes(backend, ctx, slurm_job, since=min(started, default=None),
                      deadline=deadline)
    if lost and kind not in (HARDWARE, NODE_FAILURE):
        return Remote(lost=lost)
    signalled = not slurm_job.get("ExitCode", "0:0").endswith(":0")
    if kind == HARDWARE or (kind == SUCCESS and not signalled) or len(ctx.nodes) < 2:
        return Remote(lost=lost if kind == NODE_FAILURE else {})
    return Remote(lost=lost if kind == NODE_FAILURE else {},
                  faults=faults_elsewhere(backend, ctx.nodes, ctx.node, ctx.attempt,
                                          root_events))


def lost_nodes(backend: SlurmBackend, ctx: JobContext, slurm_job: Mapping[str, str], *,
               since: float | None = None, sleep: Callable[[float], None] = time.sleep,
               deadline: float | None = None,
               clock: Callable[[], float] = time.monotonic) -> dict[str, str]:
    """``{node: Slurm's state and reason}`` for the job's other nodes Slurm lost, asked only
    when Slurm already ended the attempt by itself: a node failure (NODE_FAIL, or the job
    already requeued while this surviving node's epilog runs, which otherwise looks like
    an exit 0). ``since``: the attempt's start (root's prolog record). ``deadline`` (on
    ``clock``): the epilog's, past which Slurm's accounting is not asked.

    A node is lost when Slurm's record says DOWN or not responding. A node that is back
    (it booted, or its slurmd started, after the attempt began) counts only when Slurm
    itself ended the attempt as NODE_FAIL: its record, or its accounting of a requeued
    attempt. A slurmd that only restarted is no loss: the job's steps outlive it, and a
    job that then requeues itself (its own ``scontrol requeue``, the save before the time
    limit) must not make it one, or the user would choose when nodes count as failed.

    A reboot is held to the same rule rather than to its time alone. Slurm's BootTime is
    slurmctld's clock less the uptime the node reports, and ``since`` is a node's clock
    (the earliest prolog record; another node's own record is visible only where the
    state folder is shared): no record puts both on one clock, and a node booted just
    before the attempt (power saving's resume) reads as booted during it under a few
    seconds' skew. A node that really booted under the job loses its processes, and
    slurmctld ends the job itself (NODE_FAIL): asking for that loses no real loss, and
    leaves the times only to name the node."""
    from wrapper.restart.requeued import requeued_without_jobwrap
    from wrapper.slurm.records import SlurmJob, node_down, node_rebooted, slurmd_restarted

    job = SlurmJob.of(slurm_job)
    if len(ctx.nodes) < 2 or not (job.final_state == "NODE_FAIL"
                                  or requeued_without_jobwrap(ctx.attempt, job)):
        return {}
    found: dict[str, str] = {}
    rebooted: dict[str, str] = {}
    restarted: dict[str, str] = {}
    for node, info in node_records(backend, ctx.nodes, ctx.node):
        state = info.get("State", "")
        if node_down(info):
            reason = info.get("Reason", "").split(" [", 1)[0]
            found[node] = state + (f" ({reason})" if reason else "")
        elif since is not None and node_rebooted(info, since):
            rebooted[node] = (f"{state}, back: it booted again at "
                              f"{info.get('BootTime', '?')}, during the attempt, and Slurm "
                              "ended the attempt as NODE_FAIL")
        elif since is not None and slurmd_restarted(info, since):
            restarted[node] = (f"{state}, back: its slurmd started again at "
                               f"{info.get('SlurmdStartTime', '?')}, during the attempt, "
                               "and Slurm ended the attempt as NODE_FAIL")
    # a slurmd restart only when no node Slurm shows lost, and none that booted, explains
    # the NODE_FAIL: a rolling restart on one node is not blamed for another node's loss
    back = rebooted or ({} if found else restarted)
    if back and since is not None and (job.final_state == "NODE_FAIL" or _accounted_node_fail(
            backend, ctx, since, sleep, deadline=deadline, clock=clock)):
        found.update(back)
    return found


def _accounted_node_fail(backend: SlurmBackend, ctx: JobContext, since: float,
                         sleep: Callable[[float], None], *, deadline: float | None = None,
                         clock: Callable[[], float] = time.monotonic) -> bool:
    """Slurm's accounting has an attempt of the job that ended as NODE_FAIL after
    ``since``; asked a few times, as slurmctld sends the record to slurmdbd after it
    requeues the job. No accounting (or no answer): False, a restart stays a restart.

    Never past ``deadline`` (on ``clock``): a wait and an ask that would not end before it
    are not made (False), and an ask has at most the time left (sacct's timeout)."""
    for wait in (0.0, *ACCOUNTING_WAITS):
        if deadline is not None and clock() + wait + ACCOUNTING_MIN_ASK > deadline:
            log.get().warning("epilog.accounting_out_of_time", job_id=ctx.job_id)
            return False
        if wait:
            sleep(wait)
        left = None if deadline is None else max(deadline - clock(), 0.0)
        try:
            attempts = backend.ended_attempts(ctx.job_id, timeout=left)
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
