"""The one judge of an attempt's end: its class and what follows, from facts alone.

Two paths end attempts. The first node's epilog judges a Slurm attempt (root's facts,
Slurm's record, the other nodes' faults, the job's words weighed as such); ``jobwrap run``
judges a run of its command inside the allocation (its exit, its output, what jobwrap's
own processes did to it). Both gather their facts (each in its own way, with its own
rights) into ``Facts`` and call ``judge``, so a class means the same thing on both paths
and the policy's brakes run in one order:

1. classify the evidence (``classify``: Slurm's facts, root's, then the job's words);
2. overrides, strongest first: a fault or a loss on another node of the job (root's and
   Slurm's word: ``hardware`` or ``node_failure``), or jobwrap having ended the steps
   itself (the supervisor's hang, a watcher's fault: the run's ``ended_by``);
3. the policy (``policy.decide``: the restart limit, the brakes, the suspect checkpoint);
4. what a stopped run means (``jobwrap run`` already restarted the job's own failure in
   place until its brakes stopped it: no requeue to run the same brakes again);
5. a requeue Slurm already made (the job's own, an admin's, Slurm's): recorded, never
   asked again, and released only within the job's restart limit.

No I/O: what it needs is in ``Facts``; what follows (records, the requeue, metrics,
telling the job) is ``wrapper.restart.apply``'s, in the order it keeps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import field, replace
from typing import TYPE_CHECKING

from wrapper.fastdataclass import dataclass
from wrapper.job import events as ev
from wrapper.restart.classify import (
    HANG,
    HARDWARE,
    NODE_FAILURE,
    NOT_THE_JOBS_FAULT,
    SUCCESS,
    UNCHECKED,
    USER_ERROR,
    Classification,
    Evidence,
    classify,
)
from wrapper.restart.policy import Decision, PastAttempt, decide, restarts_spent, suspect

if TYPE_CHECKING:
    from wrapper.slurm.records import SlurmJob


@dataclass(frozen=True)
class Remote:
    """What the job's other nodes say, from root's and Slurm's sources only (gathered by
    ``wrapper.restart.remote.gather``): nodes Slurm lost, and nodes whose watcher found
    a fault (``{node: why}`` each)."""

    lost: Mapping[str, str] = field(default_factory=dict)
    faults: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Facts:
    """Everything the judge decides from. The epilog fills all of it; ``jobwrap run``
    what a run inside the allocation has (no ``remote``, ``job`` or ``run_stopped``)."""

    evidence: Evidence
    attempt: int  # the attempt's number among the job's own restarts (0: the first run)
    max_restarts: int  # after the site's limit (job.record.site_options)
    no_requeue: bool = False
    history: Sequence[PastAttempt] = ()
    checkpoint_step: int | None = None
    checkpoint_path: str | None = None
    resumed_from: str | None = None  # the checkpoint this attempt resumed from
    older_valid: str | None = None  # the valid checkpoint before the latest
    node: str = ""  # the node to exclude when the fault is this node's ("": none)
    no_progress_limit: int = 2
    asked: int | None = None  # the job's own --max-restarts, before the site's limit
    remote: Remote = field(default_factory=Remote)
    nodes: int = 1  # how many nodes the attempt had
    ended_by: str = ""  # jobwrap ended the steps: "hang", or a watcher's reason
    run_stopped: ev.RunStopped | None = None  # jobwrap run stopped (the job's word)
    job: SlurmJob | None = None  # Slurm's record when the epilog decided
    saved: str | None = None  # the supervisor saved before the limit, after this checkpoint


@dataclass(frozen=True)
class Judgement:
    verdict: Classification
    decision: Decision
    # (resumed from, older valid): the checkpoint the attempt resumed from is suspect
    fallback: tuple[str, str] | None = None
    # Slurm already requeued the job (the job, an admin, Slurm): to record, not to redo
    external: ev.RequeuedWithoutJobwrap | None = None
    # the other nodes to exclude, with why ({}: this node's own, or none)
    elsewhere: Mapping[str, str] = field(default_factory=dict)


def judge(facts: Facts) -> Judgement:
    """The class of the attempt that ended and what follows (see the module docstring)."""
    verdict, elsewhere = overridden(classify(facts.evidence), facts)
    if verdict.kind == UNCHECKED:  # the nodes Slurm skipped the prolog on, if not this one
        elsewhere = {**dict.fromkeys(facts.evidence.unchecked_elsewhere, "unchecked"),
                     **elsewhere}
    fallback = (facts.resumed_from, facts.older_valid) if (
        facts.resumed_from and facts.older_valid and suspect(
            verdict, resumed_from=facts.resumed_from,
            checkpoint_path=facts.checkpoint_path)) else None
    decision = decide(
        verdict, attempt=facts.attempt, max_restarts=facts.max_restarts,
        no_requeue=facts.no_requeue, history=list(facts.history),
        checkpoint_step=facts.checkpoint_step, checkpoint_path=facts.checkpoint_path,
        node="" if elsewhere else facts.node, no_progress_limit=facts.no_progress_limit,
        fallback=fallback, asked=facts.asked)
    if elsewhere and decision.requeue:  # exclude those nodes, not this healthy one
        decision = replace(decision, exclude_nodes=sorted(elsewhere))
    decision = after_run_stopped(decision, verdict, facts.run_stopped)
    external = None
    if facts.job is not None:
        from wrapper.restart.requeued import hold_back

        decision, external = hold_back(
            decision, verdict, attempt=facts.attempt, node=facts.node, job=facts.job,
            saved=facts.saved, max_restarts=facts.max_restarts,
            spent=restarts_spent(verdict, attempt=facts.attempt, history=facts.history))
    return Judgement(verdict, decision, fallback, external, elsewhere)


def overridden(verdict: Classification, facts: Facts
               ) -> tuple[Classification, dict[str, str]]:
    """``verdict`` after what outweighs the attempt's own evidence, with the other nodes
    it blames (``{node: why}``).

    - A node Slurm lost: ``node_failure``, unless this node's own fault is stronger
      (``hardware``) or already a node failure.
    - A GPU fault a watcher found on another node of a multi-node attempt: ``hardware``,
      unless the attempt really succeeded (Slurm's exit not a signal: a post-job check
      drained the node after the work was done).
    - jobwrap ended the run's steps (``jobwrap run``): the supervisor's hang is a
      ``hang``; any other end of jobwrap's, after which the command still ended 0, is
      no success.
    """
    lost, faults = dict(facts.remote.lost), dict(facts.remote.faults)
    if lost and verdict.kind not in (HARDWARE, NODE_FAILURE):
        where = "; ".join(f"{node}: {why}" for node, why in sorted(lost.items()))
        return Classification(NODE_FAILURE, f"Slurm lost a node of the job ({where})",
                              "node_failure", [*verdict.evidence,
                                               f"on this node: {verdict.kind}"]), lost
    signalled = facts.job is not None and facts.job.exit_signal not in (None, 0)
    if faults and facts.nodes >= 2 and verdict.kind != HARDWARE and (
            verdict.kind != SUCCESS or signalled):
        where = "; ".join(f"{node}: {why}" for node, why in sorted(faults.items()))
        return Classification(HARDWARE, f"a GPU fault on another node of the job ({where})",
                              "gpu_fault", [*verdict.evidence,
                                            f"on this node: {verdict.kind}"]), faults
    if lost and verdict.kind == NODE_FAILURE:  # Slurm's NODE_FAIL: the lost, not this node
        return verdict, lost
    if facts.ended_by == HANG:
        return Classification(HANG, "no progress for the hang timeout; jobwrap's supervisor "
                              "ended the command's steps", "hang"), {}
    if facts.ended_by and verdict.kind == SUCCESS:
        return Classification(USER_ERROR, f"jobwrap ended the command's steps "
                              f"({facts.ended_by}); the command then ended 0",
                              "ended_by_jobwrap"), {}
    return verdict, {}


def after_run_stopped(decision: Decision, verdict: Classification,
                      stopped: ev.RunStopped | None) -> Decision:
    """``decision``, or a stop when ``jobwrap run`` already restarted the work inside the
    allocation until its brakes stopped it (``run.stopped``, the user's word: it can only
    stop) and the failure is the job's own: a requeue would only run the same brakes
    again, multiplying --max-restarts. A fault that is not the job's (hardware, a lost
    node, a skipped prolog) is requeued as ever."""
    if stopped is None or not decision.requeue or verdict.kind in NOT_THE_JOBS_FAULT:
        return decision
    return Decision("stop", f"{verdict.kind}: jobwrap run restarted it inside the allocation "
                    f"and stopped ({stopped.reason}); not requeued")
