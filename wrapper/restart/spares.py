"""Spare nodes under ``jobwrap run`` (``--spare-nodes``): which nodes carry the work, which
nodes root found faulty after a failed run, and the swap of a faulty node for a spare
inside the allocation (part of the restart decision: see docs/recovery.md).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from wrapper import log
from wrapper.config import Config
from wrapper.fastdataclass import dataclass
from wrapper.submit.directives import JobOptions

if TYPE_CHECKING:
    from wrapper.job.events import Event
    from wrapper.slurm import SlurmBackend


@dataclass
class Spares:
    """The job's nodes under ``--spare-nodes``: the first ``working`` of ``nodes`` (the
    allocation now) carry the work, the rest wait, watched by their node watchers.

    srun places a step on the allocation's first nodes in its order, so the command's
    environment saying ``working`` nodes (``SLURM_JOB_NUM_NODES``, srun's ``-N``) keeps
    its steps off the spares, in nested scripts too. When a node fails, it is given back
    (``scontrol update JobId= NodeList=``; one Slurm lost is gone already under
    ``--no-kill``) and the next spare in order becomes a working node."""

    working: int
    nodes: list[str]
    used: int = 0

    @property
    def left(self) -> int:
        return len(self.nodes) - self.working

    @classmethod
    def of(cls, options: JobOptions, environ: Mapping[str, str], *,
           working: int | None = None) -> Spares | None:
        """``working``: the count an earlier attempt worked on, when it used spares (a
        job that gave nodes back is requeued with fewer: its spares are spent)."""
        from wrapper.slurm.parse import expand_hostlist

        count = options.spare_nodes or 0
        try:
            nodes = expand_hostlist(environ.get("SLURM_JOB_NODELIST", ""))
        except ValueError:
            return None
        if working is None:
            working = len(nodes) - count
        if count <= 0 or not environ.get("SLURM_JOB_ID", "").isdigit() \
                or not 0 < working < len(nodes):
            return None
        return cls(working=working, nodes=nodes)

    def environ(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The command's environment: srun's default node count is the working nodes',
        and the task count follows where the job gave tasks per node."""
        env = dict(environ)
        env["SLURM_JOB_NUM_NODES"] = env["SLURM_NNODES"] = str(self.working)
        env["SLURM_JOB_NODELIST"] = env["SLURM_NODELIST"] = ",".join(self.nodes)
        per_node = env.get("SLURM_NTASKS_PER_NODE", "")
        if per_node.isdigit() and env.get("SLURM_NTASKS", "").isdigit():
            env["SLURM_NTASKS"] = env["SLURM_NPROCS"] = str(int(per_node) * self.working)
        return env

    def replace_faulty(self, cfg: Config, faulty: Mapping[str, str],
                       say: Callable[[str], None], backend: SlurmBackend | None = None) -> bool:
        """After a failed run, ``faulty`` (:func:`faulty_nodes` of the working nodes)
        given: when spares are left, give those nodes back and move the work onto spares
        (True); else False, and the usual path decides (a restart in place, or the
        epilog's requeue)."""
        if not faulty:
            return False
        if backend is None:
            from wrapper import slurm

            backend = slurm.backend(cfg.slurm)
        keep = [n for n in self.nodes if n not in faulty]
        where = "; ".join(f"{node}: {why}" for node, why in sorted(faulty.items()))
        if len(keep) < self.working:
            say(f"jobwrap run: no spare node left for {where}")
            return False
        job_id = os.environ["SLURM_JOB_ID"]
        from wrapper.errors import JobwrapError
        from wrapper.slurm.parse import expand_hostlist

        try:  # a node Slurm lost under --no-kill has left the allocation already
            held = expand_hostlist(backend.job_info(job_id).get("NodeList", ""))
            if any(n in held for n in faulty):
                backend.shrink_job(job_id, [n for n in held if n not in faulty])
        except (JobwrapError, ValueError) as exc:
            say(f"jobwrap run: could not give back {', '.join(sorted(faulty))} ({exc}); "
                "ending, so that jobwrap requeues the job away from it")
            return False
        before = set(self.nodes[:self.working])
        self.nodes = keep
        self.used += len(faulty)
        took = [n for n in keep[:self.working] if n not in before]
        say(f"jobwrap run: {where}; gave it back and restarted on "
            f"{','.join(keep[:self.working])} (spare {','.join(took)} took its place; "
            f"{self.left} spare left)")
        from wrapper.job import events as ev

        record_claim(cfg, job_id, ev.SpareUsed(
            attempt=int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
            node=os.environ.get("SLURMD_NODENAME", ""),
            failed=sorted(faulty), reason=where[:400], replaced_by=took,
            spares_left=self.left, working=self.working))
        return True


def faulty_nodes(cfg: Config, attempt: int, backend: SlurmBackend | None = None, *,
                 nodes: Sequence[str] | None = None, suspects: Sequence[str] = (),
                 since: float | None = None) -> dict[str, str]:
    """``{node: why}`` for the job's nodes (``nodes``: these of them) root found faulty
    during this attempt: a node watcher's fault in root's record here, a node drained
    with a jobwrap reason, a node Slurm lost. Root's and Slurm's facts only; outside a
    job, or when Slurm cannot be asked, nothing (the next attempt's own watchers still
    follow it)."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        return {}
    from wrapper.errors import JobwrapError
    from wrapper.job.store import JobStore
    from wrapper.restart.remote import faults_elsewhere, node_records
    from wrapper.slurm.parse import expand_hostlist
    from wrapper.slurm.records import node_lost

    try:
        if nodes is None:
            nodes = expand_hostlist(os.environ.get("SLURM_JOB_NODELIST", ""))
        if backend is None:
            from wrapper import slurm

            backend = slurm.backend(cfg.slurm)
        events = JobStore.of(cfg, job_id).root_events()
        records = dict(node_records(backend, nodes, ""))  # one request for every node
        found = faults_elsewhere(backend, list(nodes), "", attempt, events, records)
        for node, info in records.items():
            # a node srun could not reach whose slurmd (or boot) is newer than ``since``
            # was lost and is back: Slurm's DOWN can last less than one look (a slurmd
            # restarted at once, as the goodput benchmark's is), and Slurm has by then
            # taken it out of the job's node list, the one other trace it leaves
            if node not in found and node_lost(info, since if node in suspects else None):
                found[node] = f"Slurm lost it ({info.get('State', '')}" + \
                    ("" if node_lost(info) else ", back since") + ")"
    except (JobwrapError, OSError) as exc:
        log.get().warning("run.faults_unknown", error=str(exc))
        return {}
    return found


def working_before(cfg: Config) -> int | None:
    """The working node count an earlier attempt of this job recorded when it used a
    spare (the user's own claim: a lie only misplaces the user's own steps). That
    attempt's batch node kept it in its own folder; a requeued job's batch node is often
    another, so the job's archive (shared, each node's part) is read too."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        return None
    from wrapper.archive.carry import archived_records
    from wrapper.errors import JobwrapError
    from wrapper.job import events as ev
    from wrapper.job.store import JobStore

    try:
        used = [e for e in JobStore.of(cfg, job_id).events() if isinstance(e, ev.SpareUsed)]
    except (JobwrapError, OSError):
        used = []
    newest = max((e.attempt for e in used), default=-1)
    if newest < int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) - 1:
        # an attempt since ran its batch script elsewhere: its swaps are in the archive
        records = [r for r in archived_records(cfg, job_id, os.environ.get("USER", ""))
                   if r.get("event") == ev.SpareUsed.KIND]
        used += [e for e in ev.decode_attempts(records) if isinstance(e, ev.SpareUsed)]
    used.sort(key=lambda e: (e.attempt, e.ts if isinstance(e.ts, float) else 0.0))
    return used[-1].working if used and used[-1].working > 0 else None


def record_claim(cfg: Config, job_id: str, event: Event) -> None:
    """Append to the job's (the user's) event file; without its state folder, nothing."""
    from wrapper.errors import JobwrapError
    from wrapper.job.store import JobStore

    try:
        JobStore.of(cfg, job_id).record(event)
    except (JobwrapError, OSError) as exc:
        log.get().debug("run.not_recorded", error=str(exc))


def await_verdict(ask: Callable[[], dict[str, str]], suspects: Sequence[str], *,
                  wait_s: float, poll_s: float = 2.0,
                  stop: Callable[[], bool] = lambda: False,
                  clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> dict[str, str]:
    """Root's and Slurm's faults (``ask``: :func:`faulty_nodes`) once one of ``suspects``
    is among them, or what ``ask`` says after ``wait_s``. srun can end before slurmctld
    has judged a node it could not reach (a node is marked not responding only after a
    failed ping): restarting at once would launch on the lost node again, fail the same
    way and spend the restarts, and a spare would never be used. ``stop``: the job is
    being ended (scancel's SIGTERM came): what ``ask`` says now, at once."""
    deadline = clock() + wait_s
    while True:
        found = ask()
        if any(node in found for node in suspects) or clock() >= deadline or stop():
            return found
        sleep(max(0.0, min(poll_s, deadline - clock())))
