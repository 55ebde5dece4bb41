"""What follows the first node's verdict on an attempt, in one owner and in order: record
the decision (and a suspect checkpoint, a requeue Slurm made), requeue, then tell the
metrics, the goodput ledger and the job, name a hung attempt's stuck ranks, and record
every node's speed score (the job told when a node was named slow).

The verdict itself is ``wrapper.restart.attempt.decide`` (the one judge,
``wrapper.restart.judge``). This lives with the hooks because it reaches every package
that reports a verdict (goodput, metrics, the forensics of ``watch``), which the restart
package must not import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wrapper.job import events as ev

if TYPE_CHECKING:
    from wrapper.config import Config
    from wrapper.job.record import JobRecord
    from wrapper.job.store import JobStore
    from wrapper.osl.users import UserIds
    from wrapper.restart.apply import Spawner
    from wrapper.restart.attempt import Outcome
    from wrapper.slurm import SlurmBackend
    from wrapper.slurm.context import JobContext


def act(ctx: JobContext, cfg: Config, store: JobStore, backend: SlurmBackend,
        record: JobRecord, outcome: Outcome, *, spawn: Spawner | None = None) -> None:
    """Everything that follows ``outcome`` (see the module docstring)."""
    from wrapper.restart import apply
    from wrapper.restart.classify import HANG

    verdict, decision = outcome.verdict, outcome.decision
    if outcome.external is not None:
        store.record(outcome.external)
    if outcome.fallback is not None:
        apply.record_suspect(store, ctx, verdict, outcome.gathered)
    apply.record(store, ctx, verdict, decision, outcome.gathered)
    if decision.requeue:
        apply.requeue(ctx, cfg, store, backend, decision, spawn=spawn,
                      already_requeued=outcome.external is not None)
    if cfg.metrics.textfile and verdict.kind != "success":
        from wrapper import metrics

        metrics.record_failure(cfg.metrics, verdict.kind, requeued=decision.requeue,
                               node=ctx.node)
    from wrapper.goodput.hook import after_attempt  # metrics, notifications, sacct

    after_attempt(cfg, store.state, backend, attempt=ctx.attempt, node=ctx.node,
                  kind=verdict.kind, decision=decision.action, reason=decision.reason,
                  user=record.user)
    used_run = any(isinstance(e, ev.RunStarted) for e in store.user_claims(ctx.attempt))
    apply.tell_the_job(ctx, record, outcome.user, verdict, decision,
                       apply.in_place_hint(verdict, decision, used_run=used_run))
    if verdict.kind == HANG:  # a hang restarted in place and then healed tells nothing
        from wrapper.watch.forensics import conclude

        conclude(store.state, ctx.job_id, ctx.attempt, record.stdout, outcome.user)

    tell_speed(store, ctx.attempt, ctx.node, record.stdout, outcome.user)


def tell_speed(store: JobStore, attempt: int, node: str, stdout: str,
               user: UserIds) -> str | None:
    """Every node's newest speed score in ``attempt`` (the first node's judge's file,
    wrapper/pulse/judge.py ``SlowJudge``) recorded as root's ``pulse.speed``; when it named
    a node slow, one line in the job's output. The line, or None when nothing was told."""
    from wrapper.errors import JobwrapError
    from wrapper.job.paths import PULSE_SPEED_FILE

    try:
        kept = store.state.read_json(PULSE_SPEED_FILE)
    except (JobwrapError, OSError, ValueError):
        return None
    if kept is None or kept.get("attempt") != attempt or \
            not isinstance(scores := kept.get("scores"), dict):
        return None
    scores = {str(k): float(v) for k, v in scores.items() if isinstance(v, int | float)}
    named = [str(n) for n in kept.get("named") or [] if n in scores]
    window = kept.get("window_s")
    store.record(ev.PulseSpeed(attempt=attempt, node=node, scores=scores, named=named,
        window_s=float(window) if isinstance(window, int | float) else 0.0))
    if not named:
        return None
    from wrapper.job.output import tell

    slow = [e for e in store.root_events() if isinstance(e, ev.PulseSlow) and
            e.attempt == attempt]
    when = "; ".join(f"{e.slow} at {e.score:.2f}" for e in slow) or ", ".join(named)
    line = (f"jobwrap: slow node(s) in attempt {attempt}: {when} of the job's typical rank's "
            "speed when named (the share of time a rank needed a CPU, against the others'); "
            "every node at the end: " + ", ".join(f"{n} {s:.2f}" for n, s in scores.items())
            + ". jobwrap status JOBID shows them.")
    tell(stdout, user, line)
    return line
