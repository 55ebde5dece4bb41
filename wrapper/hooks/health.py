"""The GPU and version gate of the prolog and epilog: check, and drain only a real fault.

A failed check drains this node through the Slurm adapter with the report's precise
reason (``jobwrap: <check> gpu<i>(<uuid>): <detail>``). A probe or config that does not
work is jobwrap's problem, not the node's: it is raised to the hook frame, which by
default logs it and lets the job run. The node's configured gres is cached in the node
state for ``GRES_TTL`` seconds so the prolog does not ask Slurm on every job.

The node state's files (``<state_dir>/nodes/``) are caches of what Slurm or the binaries
say: each has a ``format`` (``NODE_FORMAT``, docs/upgrades.md), and one a newer jobwrap
wrote is a miss here, asked again and written over, never an error.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wrapper import log
from wrapper.config import Config
from wrapper.errors import FormatTooNew, JobwrapError, format_of
from wrapper.job import events as ev
from wrapper.job.store import JobStore
from wrapper.slurm import SlurmBackend
from wrapper.slurm.context import JobContext
from wrapper.state import JobState

if TYPE_CHECKING:
    from wrapper.gpu.report import Report
    from wrapper.hooks import Services

GRES_TTL = 600.0
VERSION_CHECKS = ("driver", "cuda", "nccl", "fabric_manager", "commands")
SCONTROL_FACTS = "scontrol.json"  # in <state_dir>/nodes: what this node's scontrol can do
NODE_FORMAT = 1  # the "format" of the files in <state_dir>/nodes


def _cached(path: Path) -> dict[str, Any] | None:
    """A node cache file's content; None when it is absent, unreadable or of a newer
    jobwrap's format (a miss: the caller asks again)."""
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            return None
        format_of(data, "format", known=NODE_FORMAT, path=path, what="node cache")
    except (OSError, ValueError, FormatTooNew):
        return None
    return data


def check_node(ctx: JobContext, cfg: Config, env: Mapping[str, str], *, phase: str,
               backend: SlurmBackend, state: JobState, services: Services | None = None
               ) -> Report:
    from wrapper.gpu.report import run_checks

    gres = configured_gres(cfg, ctx.node, backend)
    if services is None:
        from wrapper.gpu.probe import open_probe

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
    from wrapper.gpu.report import parse_gres_gpus

    cache = Path(cfg.paths.state_dir) / "nodes" / f"{node}.json"
    data = _cached(cache)
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
        cache.parent.mkdir(mode=0o755, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"format": NODE_FORMAT, "at": time.time(), "gpus": gpus,
                                   "gres": gres}))
        tmp.replace(cache)
    except OSError as exc:
        log.get().warning("health.gres_cache_unwritable", error=str(exc))
    return gpus


def _scontrol_identity(cfg: Config) -> list[int | str] | None:
    """The scontrol the backend runs, as (path, inode, size, mtime): changes on an upgrade."""
    name = cfg.slurm.scontrol_command
    # shutil.which's own walk, without importing shutil (and bz2, lzma) on every prolog
    for folder in ([""] if os.sep in name else os.get_exec_path()):
        path = os.path.join(folder, name)
        try:
            st = os.stat(path)
        except OSError:
            continue
        if not os.path.isdir(path) and os.access(path, os.X_OK):
            return [path, st.st_ino, st.st_size, st.st_mtime_ns]
    return None


def recall_scontrol(cfg: Config, backend: SlurmBackend) -> None:
    """Spare the prolog a failing ``scontrol --json`` per job where this scontrol has none.

    Slurm before 23.02 answers ``--json`` with an error: found once, kept in root's node
    state with the binary's identity, so an upgraded scontrol is asked again.
    """
    from wrapper.slurm import CliBackend

    if not isinstance(backend, CliBackend) or backend.json_supported is not None:
        return
    data = _cached(Path(cfg.paths.state_dir) / "nodes" / SCONTROL_FACTS)
    if data is not None and data.get("json") is False and \
            data.get("scontrol") == _scontrol_identity(cfg):
        backend.json_supported = False


def remember_scontrol(cfg: Config, backend: SlurmBackend) -> None:
    """Keep what the backend found out about ``scontrol --json`` (see recall_scontrol)."""
    from wrapper.slurm import CliBackend

    if not isinstance(backend, CliBackend) or backend.json_supported is not False:
        return
    cache = Path(cfg.paths.state_dir) / "nodes" / SCONTROL_FACTS
    facts = {"format": NODE_FORMAT, "json": False, "scontrol": _scontrol_identity(cfg)}
    if _cached(cache) == facts:
        return
    try:
        cache.parent.mkdir(mode=0o755, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
        tmp.write_text(json.dumps(facts))
        tmp.replace(cache)
    except OSError as exc:
        log.get().warning("health.scontrol_facts_unwritable", error=str(exc))


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
