"""The GPU and version gate of the prolog and epilog: check, and drain only a real fault.

A failed check drains this node through the Slurm adapter with the report's precise
reason (``jobwrap: <check> gpu<i>(<uuid>): <detail>``). A probe or config that does not
work is jobwrap's problem, not the node's: it is raised to the hook frame, which by
default logs it and lets the job run. The node's configured gres is cached in the node
state (``wrapper.slurm.commands.write_node_file``) for ``GRES_TTL`` seconds so the
prolog does not ask Slurm on every job.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from wrapper import log
from wrapper.config import Config
from wrapper.errors import JobwrapError
from wrapper.job import events as ev
from wrapper.job.state import JobState
from wrapper.job.store import JobStore
from wrapper.slurm import SlurmBackend
from wrapper.slurm.context import JobContext

if TYPE_CHECKING:
    from wrapper.gpu.report import Report
    from wrapper.hooks.services import Services

GRES_TTL = 600.0
VERSION_CHECKS = ("driver", "cuda", "nccl", "fabric_manager", "commands")


def check_node(ctx: JobContext, cfg: Config, env: Mapping[str, str], *, phase: str,
               backend: SlurmBackend, state: JobState, services: Services | None = None
               ) -> Report:
    from wrapper.gpu.report import run_checks

    gres = configured_gres(cfg, ctx.node, backend)
    if services is None:
        from wrapper.gpu.backend import open_probe

        probe = open_probe(cfg.gpu, ctx.node)
    else:
        probe = services.open_probe(ctx.node)
    try:
        report = run_checks(cfg, probe, phase=phase, allocated=ctx.gpus, configured_gres=gres,
                            env=env, runner=services.runner if services else None)
    finally:
        probe.close()
    failures = [r.reason for r in report.failures]
    warnings = [r.reason for r in report.warnings]
    JobStore(state).record(ev.Health(
        attempt=ctx.attempt, node=ctx.node, phase=phase, verdict=report.verdict,
        failures=failures, warnings=warnings, seconds=round(report.duration_s, 3),
        # what the version checks read: the manifest's software stack
        versions=[r.as_dict() for r in report.results if r.check in VERSION_CHECKS]))
    if cfg.metrics.textfile:
        from wrapper import metrics

        metrics.record_node_health(cfg.metrics, [
            (r.check, "" if r.gpu_index is None else str(r.gpu_index), r.status)
            for r in report.results], node=ctx.node)
    logger = log.get()
    for reason in warnings:
        logger.warning("health.warn", phase=phase, reason=reason)
    if report.verdict == "fail":
        reason = report.drain_reason() or "jobwrap: health check failed"
        backend.drain_node(ctx.node, reason)
        from wrapper.notify import notify

        notify(cfg, "drain", job_id=ctx.job_id, attempt=ctx.attempt, node=ctx.node,
               reason=reason)
        logger.error("health.drained", phase=phase, reason=reason)
    return report


def configured_gres(cfg: Config, node: str, backend: SlurmBackend) -> int | None:
    """GPUs in the node's gres, from a short-lived cache or from Slurm (None if unknown)."""
    from wrapper.slurm.commands import node_file, read_node_file, write_node_file
    from wrapper.slurm.records import parse_gres_gpus

    cache = node_file(cfg.paths.state_dir, f"{node}.json")
    data = read_node_file(cache)
    try:
        if data is not None and time.time() - float(data["at"]) < GRES_TTL:
            return int(data["gpus"])
    except (ValueError, KeyError, TypeError):
        pass
    try:
        gres = backend.node_info(node).get("Gres", "")
    except JobwrapError as exc:
        log.get().warning("health.gres_unknown", error=str(exc))
        return None
    gpus = parse_gres_gpus(gres)
    try:
        write_node_file(cache, {"at": time.time(), "gpus": gpus, "gres": gres})
    except OSError as exc:
        log.get().warning("health.gres_cache_unwritable", error=str(exc))
    return gpus


def unchecked(cfg: Config, state: JobState, ctx: JobContext, error: JobwrapError, *,
              what: type[ev.HealthUnavailable | ev.ScratchUnavailable] = ev.HealthUnavailable
              ) -> None:
    """The checks could not run (a broken probe or config): jobwrap's fault, not the node's.

    Re-raised when the site asked to drain on jobwrap's own failures; otherwise logged
    loudly and recorded, and the hook goes on with the job.
    """
    if cfg.hooks.on_internal_error == "drain":
        raise error
    log.get().error(what.KIND, error=str(error), kind=type(error).__name__)
    JobStore(state).record(what(attempt=ctx.attempt, node=ctx.node, error=str(error)))
