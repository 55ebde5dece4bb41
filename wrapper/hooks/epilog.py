"""The epilog (root, every allocated node): record the end, and on the job's first node
classify the attempt's outcome and requeue it when a retry can help.

Everything read from the user's files (the output's tail, the checkpoints) is read with
the user's rights, and decides nothing by itself: control flow follows root's own
events and the supervisor's root-owned channel (``wrapper.facts``); a GPU fault anyone
reports is hardware only once root's probe confirms it. A stage-out that did not bring
everything back keeps the scratch in quarantine instead of removing it.

A requeue is made at once (so the decision survives anything that follows) and a
detached ``jobwrap release`` makes the job eligible as soon as Slurm has finished
completing it, instead of after Slurm's fixed 121 s requeue delay.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from wrapper import jobrecord, log, slurm
from wrapper import state as state_mod
from wrapper.classify import Classification, Evidence, classify
from wrapper.config import Config
from wrapper.errors import EXIT_OK, JobwrapError
from wrapper.osl.child import call_as
from wrapper.osl.files import append_text_line as append_line
from wrapper.osl.files import read_tail_text
from wrapper.osl.users import UserIds
from wrapper.policy import Decision, PastAttempt, decide
from wrapper.slurm.context import JobContext
from wrapper.state import JobState

OUTPUT_TAIL_BYTES = 65536  # of the job's output, read to classify the attempt
USER_IO_TIMEOUT = 10.0  # seconds a read or write of the job's output may take

# Slurm's Reason while a job is COMPLETING tells what ended it.
_REASON_STATE = {"TimeLimit": "TIMEOUT", "NodeDown": "NODE_FAIL", "NodeFail": "NODE_FAIL",
                 "Preempted": "PREEMPTED", "OutOfMemory": "OUT_OF_MEMORY"}


def run(ctx: JobContext, cfg: Config, out: TextIO, env: Mapping[str, str] | None = None) -> int:
    started = time.monotonic()
    logger = log.get()
    state = state_mod.for_job(cfg, ctx.job_id)
    # The prolog normally made the directory; an epilog after a failed prolog must not fail.
    state.prepare(ctx.uid, ctx.gid)
    state.append("epilog.context", node=ctx.node, hook=ctx.hook, attempt=ctx.attempt,
                 context=ctx.as_dict())
    gpu_check_failed = False
    gpu_checked = False
    backend = slurm.backend(cfg.slurm)
    if cfg.checks.epilog:
        from wrapper.hooks.health import check_node, unchecked

        # A failed post-job check drains this node with its reason; the epilog itself
        # exits 0 so that Slurm does not replace that reason with "Epilog error".
        try:
            report = check_node(ctx, cfg, env or {}, phase="epilog", backend=backend,
                                state=state)
            gpu_check_failed, gpu_checked = report.verdict == "fail", True
        except JobwrapError as exc:
            unchecked(cfg, state, ctx, exc)
    # After a failed prolog Slurm has already counted the restart, so the attempt numbers
    # differ: what tells is that this node's last prolog event is the failure.
    from wrapper.facts import root_events

    # Root's events only: the user's event file could say anything.
    prolog_events = [e.get("event") for e in root_events(state) if e.get("node") == ctx.node
                     and str(e.get("event", "")).startswith("prolog.")]
    if prolog_events and prolog_events[-1] == "prolog.unhealthy":
        # The job never started: Slurm requeues it after the failed prolog by itself.
        logger.info("epilog.after_failed_prolog")
        return EXIT_OK
    try:
        record = jobrecord.load(state)
    except JobwrapError:
        record = jobrecord.gather(ctx, backend)
    info: dict[str, str] = {}
    if ctx.first_node:
        _decision, info = decide_attempt(ctx, cfg, state, record, backend,
                                         gpu_check_failed=gpu_check_failed,
                                         gpu_checked=gpu_checked)
    from wrapper.hooks import staging

    deadline = started + cfg.hooks.epilog_budget
    not_back: list[str] = []
    try:  # outputs first: a failed job's partial results are not lost
        not_back = staging.stage_out(ctx, cfg, state, record, deadline=deadline)
    except JobwrapError as exc:
        log.get().error("epilog.stage_out_broken", error=str(exc))
        not_back = [str(exc)]
    if cfg.archive.enabled:
        _archive(ctx, cfg, state, record, backend, info)
    try:  # only once the archive is complete; what did not come back is kept
        if not_back:
            staging.keep_results(ctx, cfg, state, record, not_back)
        else:
            staging.remove_scratch(ctx, cfg, state)
    except JobwrapError as exc:
        log.get().error("epilog.scratch_not_removed", error=str(exc))
    staging.prune_kept(cfg)
    _prune_user_files(cfg)
    logger.info("epilog.done", exit_code=ctx.exit_code, exit_signal=ctx.exit_signal)
    return EXIT_OK


def _archive(ctx: JobContext, cfg: Config, state: JobState, record: jobrecord.JobRecord,
             backend: slurm.SlurmBackend, info: dict[str, str]) -> None:
    """This node's part of the attempt's archive; never fails the epilog."""
    from wrapper.archive import archive_attempt

    script = ""
    if ctx.first_node:
        try:
            script = backend.batch_script(ctx.job_id)
        except JobwrapError as exc:
            log.get().warning("epilog.script_unavailable", error=str(exc))
    result = archive_attempt(cfg, state, record, attempt=ctx.attempt, node=ctx.node,
                             script_text=script, extra={"slurm": info})
    state.append("archive", attempt=ctx.attempt, node=ctx.node, path=str(result.path),
                 complete=result.complete, files=len(result.files),
                 problems=list(result.problems), seconds=round(result.elapsed_s, 3))
    for problem in result.problems:
        log.get().warning("epilog.archive_problem", problem=str(problem))


def decide_attempt(ctx: JobContext, cfg: Config, state: JobState, record: jobrecord.JobRecord,
                   backend: slurm.SlurmBackend, *, gpu_check_failed: bool,
                   gpu_checked: bool = True) -> tuple[Decision, dict[str, str]]:
    """Classify the attempt, decide, requeue; returns the decision and Slurm's job record.

    ``gpu_check_failed``: root's post-job check on this node failed; ``gpu_checked``:
    it ran (else a reported GPU fault is confirmed by a probe of root's own here).
    """
    from wrapper.classify import reports_gpu_fault
    from wrapper.facts import root_events, supervisor_facts, user_claims

    user = UserIds.of(record.uid, record.gid)
    mine = root_events(state)
    events = [e for e in mine if e.get("attempt") == ctx.attempt]
    supervisor_events = supervisor_facts(state, ctx.attempt)
    claims = {str(e.get("event")) for e in user_claims(state, ctx.attempt)}
    unconfirmed = tuple(f"{name} in the job's own event file" for name in
                        sorted(claims & {"hang", "gpu.fault"} - set(supervisor_events)))
    info: dict[str, str] = {}
    try:
        info = backend.job_info(ctx.job_id)
    except JobwrapError as exc:
        log.get().warning("epilog.job_info_unavailable", error=str(exc))
    tail = ""
    for path in dict.fromkeys([record.stdout, record.stderr]):
        if path:
            try:
                # The user's rights, a no-follow non-blocking open of a regular file only,
                # a bounded tail and a deadline: a FIFO, /dev/zero or a huge file in the
                # output's place cannot hold the epilog.
                tail += call_as(user, read_tail_text, path, OUTPUT_TAIL_BYTES,
                                timeout=USER_IO_TIMEOUT)
            except JobwrapError as exc:
                log.get().warning("epilog.output_unreadable", path=path, error=str(exc))
    if not gpu_check_failed and not gpu_checked and (
            "gpu.fault" in supervisor_events or "gpu.fault" in claims
            or reports_gpu_fault(tail)):
        gpu_check_failed = _confirm_gpu_fault(ctx, cfg, state)
    staging_failed = next((str(e.get("error")) for e in events
                           if ((e.get("event") == "staging.failed"
                                 and e.get("direction") == "in")
                                or e.get("event") == "directives.invalid")), "")
    evidence = Evidence(exit_code=ctx.exit_code, exit_signal=ctx.exit_signal,
                        staging_error=staging_failed,
                        slurm_state=_final_state(info), supervisor_events=supervisor_events,
                        gpu_check_failed=gpu_check_failed, unconfirmed=unconfirmed,
                        output_tail=tail)
    verdict = classify(evidence)
    checkpoint = _latest_checkpoint(record, user)
    history = [PastAttempt(int(e.get("attempt", 0)), str(e.get("kind")), str(e.get("signature")),
                           e.get("checkpoint_step"), e.get("checkpoint_path"))
               for e in mine
               if e.get("event") == "attempt.end" and e.get("attempt") != ctx.attempt]
    options = record.job_options
    max_restarts = options.max_restarts if options.max_restarts is not None \
        else cfg.restart.max_restarts
    # sbatch --no-requeue (or a site's job_submit) leaves Requeue=0: Slurm would refuse.
    no_requeue = options.no_requeue or info.get("Requeue") == "0"
    decision = decide(verdict, attempt=ctx.attempt, max_restarts=max_restarts,
                      no_requeue=no_requeue, history=history,
                      checkpoint_step=checkpoint.get("step") if checkpoint else None,
                      checkpoint_path=checkpoint.get("path") if checkpoint else None,
                      node=ctx.node, no_progress_limit=cfg.restart.no_progress_limit)
    _record(state, ctx, verdict, decision, checkpoint, evidence)
    if cfg.metrics.textfile and verdict.kind != "success":
        from wrapper import metrics

        metrics.record_failure(cfg.metrics, verdict.kind, requeued=decision.requeue,
                               node=ctx.node)
    if decision.requeue:
        try:
            _requeue(ctx, cfg, backend, decision)
        except JobwrapError as exc:  # Slurm said no: record it, and go on with the epilog
            log.get().error("epilog.requeue_failed", error=str(exc))
            state.append("requeue.failed", attempt=ctx.attempt, node=ctx.node, error=str(exc))
    from wrapper.goodput.hook import after_attempt  # metrics, notifications, sacct

    after_attempt(cfg, state, attempt=ctx.attempt, node=ctx.node, kind=verdict.kind,
                  decision=decision.action, reason=decision.reason, user=record.user)
    if decision.action != "done" and record.stdout:
        message = f"jobwrap: attempt {ctx.attempt} ended: {verdict.kind} ({verdict.detail}). " \
                  f"{'Requeued' if decision.requeue else 'Not requeued'}: {decision.reason}"
        try:
            call_as(user, append_line, record.stdout, message, timeout=USER_IO_TIMEOUT)
        except JobwrapError as exc:
            log.get().warning("epilog.output_unwritable", error=str(exc))
    return decision, info


def _confirm_gpu_fault(ctx: JobContext, cfg: Config, state: JobState) -> bool:
    """A GPU fault was reported and the post-job check did not run: root probes itself."""
    from wrapper.facts import confirm_gpu_fault

    try:
        faults = confirm_gpu_fault(cfg, ctx.node, ctx.gpus)
    except JobwrapError as exc:  # the probe, not the GPU: nothing is confirmed
        log.get().error("epilog.gpu_unconfirmed", error=str(exc))
        return False
    state.append("gpu.confirmed" if faults else "gpu.not_confirmed", attempt=ctx.attempt,
                 node=ctx.node, faults=faults)
    return bool(faults)


def _final_state(info: dict[str, str]) -> str:
    state = info.get("JobState", "")
    if state == "COMPLETING" or not state:
        return _REASON_STATE.get(info.get("Reason", ""), "")
    return state


def _latest_checkpoint(record: jobrecord.JobRecord, user: UserIds) -> dict[str, Any] | None:
    if not record.checkpoint_dir:
        return None
    try:
        found: dict[str, Any] | None = call_as(user, _find, record.checkpoint_dir,
                                               record.job_options.checkpoint_glob,
                                               record.job_options.checkpoint_marker)
    except JobwrapError as exc:
        log.get().warning("epilog.checkpoints_unreadable", error=str(exc))
        return None
    return found


def _find(directory: str, glob: str | None, marker: str | None) -> dict[str, Any] | None:
    from wrapper.checkpoints import latest_valid

    # The job has ended: nothing is still writing, so no settle time is needed.
    found = latest_valid(directory, glob=glob, marker=marker, settle_seconds=0).latest
    return {"path": found.path, "step": found.step, "layout": found.layout} if found else None


def _record(state: JobState, ctx: JobContext, verdict: Classification, decision: Decision,
            checkpoint: dict[str, Any] | None, evidence: Evidence) -> None:
    state.append("attempt.end", attempt=ctx.attempt, node=ctx.node, kind=verdict.kind,
                 detail=verdict.detail, signature=verdict.signature,
                 exit_code=evidence.exit_code, exit_signal=evidence.exit_signal,
                 slurm_state=evidence.slurm_state,
                 checkpoint_path=checkpoint.get("path") if checkpoint else None,
                 checkpoint_step=checkpoint.get("step") if checkpoint else None,
                 decision=decision.action, reason=decision.reason, exclude=decision.exclude_nodes)
    log.get().info("epilog.decision", kind=verdict.kind, decision=decision.action,
                   reason=decision.reason)


def _requeue(ctx: JobContext, cfg: Config, backend: slurm.SlurmBackend,
             decision: Decision) -> None:
    from wrapper import detach

    backend.requeue(ctx.job_id)
    argv = detach.jobwrap_argv("release", ctx.job_id)
    for node in decision.exclude_nodes:
        argv += ["--exclude", node]
    detach.spawn(argv, detach.hook_env(cfg.source))


def _prune_user_files(cfg: Config) -> None:
    """Finished jobs' user-writable event files past their retention (never fails)."""
    from wrapper.state import prune_stale_user_files

    try:
        pruned = prune_stale_user_files(Path(cfg.paths.state_dir),
                                        cfg.hooks.user_events_days * 86400, time.time())
    except JobwrapError as exc:
        log.get().error("epilog.prune_failed", error=str(exc))
        return
    if pruned:
        log.get().info("epilog.user_files_pruned", jobs=pruned)
