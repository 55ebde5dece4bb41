"""Run the checks and judge the node: :func:`run_checks` -> :class:`Report`.

This is what the prolog, the epilog and ``jobwrap check`` call. The probe is read once,
in a worker thread bounded by ``[checks] probe_budget`` (an NVML call on a sick GPU can
hang for minutes); each check then runs on those readings and is timed against
``[checks] check_budget``.

``Report.as_json()`` is a stable shape (``schema`` 1)::

    {"schema": 1, "phase": "prolog", "verdict": "fail",
     "drain_reason": "jobwrap: row_remap gpu1(GPU-1a2b3c4d): row remapping failed ...",
     "duration_s": 0.012, "counts": {"pass": 30, "warn": 1, "fail": 1},
     "results": [{"check": "ecc", "status": "pass", "gpu_index": 0,
                  "gpu_uuid": "GPU-...", "reason": "no uncorrectable ECC errors"}, ...]}

``drain_reason`` is null unless the verdict is "fail".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from wrapper.fastdataclass import dataclass

# Importing the modules registers their checks, in the order they appear in a report.
from wrapper.gpu import checks as _checks
from wrapper.gpu import versions as _versions
from wrapper.gpu.checks import (
    PHASES,
    REGISTRY,
    CheckInput,
    CheckResult,
    Status,
    node_result,
    resolve_allocation,
    worst,
)
from wrapper.gpu.probe import GpuReading, Probe, ProbeError

if TYPE_CHECKING:
    from wrapper.config import Config
    from wrapper.runner import Runner

SCHEMA = 1
DRAIN_REASON_MAX = 120
TARGETS = ("gpu", "versions", "all")


@dataclass(frozen=True)
class Report:
    phase: str
    results: tuple[CheckResult, ...]
    duration_s: float = 0.0

    @property
    def verdict(self) -> Status:
        """fail if any check failed, else warn if any warned, else pass. warn is healthy."""
        return worst([r.status for r in self.results])

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "fail"]

    @property
    def warnings(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "warn"]

    def drain_reason(self) -> str | None:
        """``jobwrap: <check> gpu<index>(<uuid prefix>): <detail>``, at most 120
        characters on one line, naming the first failure (and how many more there are);
        None when nothing failed."""
        failures = self.failures
        if not failures:
            return None
        first = failures[0]
        where = ""
        if first.gpu_index is not None:
            where = f" gpu{first.gpu_index}"
            if first.gpu_uuid:
                where += f"({first.gpu_uuid[:12]})"
        more = f" (+{len(failures) - 1} more)" if len(failures) > 1 else ""
        text = " ".join(f"jobwrap: {first.check}{where}: {first.reason}".split())
        room = DRAIN_REASON_MAX - len(more)
        if len(text) > room:
            text = text[:room - 3].rstrip() + "..."
        return text + more

    def as_json(self) -> dict[str, Any]:
        counts = {status: sum(r.status == status for r in self.results)
                  for status in ("pass", "warn", "fail")}
        return {"schema": SCHEMA, "phase": self.phase, "verdict": self.verdict,
                "drain_reason": self.drain_reason(), "duration_s": round(self.duration_s, 4),
                "counts": counts, "results": [r.as_dict() for r in self.results]}


@dataclass
class Readings:
    """What the probe answered, read in one go within the probe's budget."""

    devices: tuple[GpuReading, ...] = ()
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    error: ProbeError | None = None


def read_probe(probe: Probe, fields: Collection[str], *, devices: bool, versions: bool,
               budget: float) -> Readings:
    """Read the probe in a worker thread; a probe still busy after ``budget`` seconds is a
    ProbeError of kind "timeout" (the thread is left behind: NVML cannot be interrupted,
    and the process ends soon after). A ProbeError is returned in ``error``."""
    out = Readings()
    crashed: list[BaseException] = []

    def work() -> None:
        try:
            if devices:
                out.devices = tuple(sorted(probe.devices(fields), key=lambda r: r.index))
            if versions:
                out.driver_version = probe.driver_version()
                out.cuda_driver_version = probe.cuda_driver_version()
        except ProbeError as exc:
            out.error = exc
        except BaseException as exc:  # a bug: re-raised in the caller's thread below
            crashed.append(exc)

    worker = threading.Thread(target=work, name="jobwrap-gpu-probe", daemon=True)
    worker.start()
    worker.join(budget)
    if worker.is_alive():
        raise ProbeError(f"the {probe.name} probe did not answer within [checks] probe_budget "
                         f"= {budget:g} s (a hung GPU or driver?)", kind="timeout")
    if crashed:
        raise crashed[0]
    return out


def run_checks(cfg: Config, probe: Probe, *, phase: str, allocated: Collection[int] | None,
               configured_gres: int | None, env: Mapping[str, str], target: str = "all",
               runner: Runner | None = None,
               clock: Callable[[], float] = time.monotonic) -> Report:
    """Run the enabled checks of ``target`` (gpu, versions or all) and judge the node.

    ``allocated``: Slurm's GPU ids of the job on this node (SLURM_JOB_GPUS); None in a
    hook means "read SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES from ``env``", and outside a
    job (phase "check") "every GPU". ``configured_gres``: the GPUs Slurm's gres gives this
    node, if known (see :func:`wrapper.slurm.records.parse_gres_gpus`).

    A GPU that is lost, or a driver missing on a node whose gres lists GPUs, is a failed
    check. Raises ConfigError for bad ``[checks]``/``[versions]`` values and ProbeError
    when the probe itself is broken or hung: those are jobwrap's problems, not the node's.
    """
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {', '.join(PHASES)}, not {phase!r}")
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, not {target!r}")
    problems = _checks.config_problems(cfg) + _versions.config_problems(cfg)
    if problems:
        from wrapper.errors import ConfigError

        raise ConfigError(cfg.source, problems)
    started = clock()
    groups = {"gpu", "versions"} if target == "all" else {target}
    chosen = [c for c in REGISTRY.values() if c.group in groups and c.enabled(cfg)]
    fields = frozenset().union(*(c.fields for c in chosen))
    readings = read_probe(probe, fields, devices=any(c.group == "gpu" for c in chosen),
                          versions="versions" in groups, budget=cfg.checks.probe_budget)
    if readings.error is not None:
        verdict_row = _probe_failure(readings.error, configured_gres)
        return Report(phase, (verdict_row,), clock() - started)
    allocation = resolve_allocation(readings.devices, allocated, env, phase=phase,
                                    id_kind=cfg.checks.slurm_gpu_ids)
    if runner is None:
        from wrapper.runner import Runner

        runner = Runner()
    results: list[CheckResult] = []
    budget = cfg.checks.check_budget
    for check in chosen:
        begun = clock()
        inp = CheckInput(cfg=cfg, phase=phase, visible=readings.devices, allocation=allocation,
                         configured_gres=configured_gres,
                         driver_version=readings.driver_version,
                         cuda_driver_version=readings.cuda_driver_version, probe=probe,
                         runner=runner, deadline=time.monotonic() + budget)
        results += check.run(inp)
        took = clock() - begun
        if took > budget:
            results.append(node_result(check.name, "warn", f"took {took:.1f} s, over its "
                                       f"[checks] check_budget of {budget:g} s"))
    return Report(phase, tuple(results), clock() - started)


def _probe_failure(error: ProbeError, configured_gres: int | None) -> CheckResult:
    if error.kind == "gpu":
        detail = str(error).replace(f"gpu{error.gpu_index}: ", "", 1)
        return CheckResult("probe", "fail", error.gpu_index, None, detail)
    if error.kind == "node":
        return node_result("probe", "fail", str(error))
    if error.kind == "no-driver" and configured_gres:
        return node_result("probe", "fail", f"{error} - but Slurm's gres lists "
                           f"{configured_gres} GPUs here")
    if error.kind == "no-driver" and configured_gres == 0:
        return node_result("probe", "pass", "no NVIDIA driver, and Slurm's gres lists no GPU "
                           "on this node: nothing to check")
    raise error
