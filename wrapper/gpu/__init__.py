"""GPU health and software-version checks: a probe seam (nvml or fake), the checks, a verdict.

What the prolog and epilog call::

    probe = open_probe(cfg.gpu, ctx.node)
    try:
        report = run_checks(cfg, probe, phase="prolog", allocated=ctx.gpus,
                            configured_gres=gres, env=environ)
    finally:
        probe.close()
    if report.verdict == "fail": drain with report.drain_reason()

Importing this package loads no GPU library: pynvml is imported by the nvml probe on its
first call.
"""

from wrapper.gpu.checks import CheckResult
from wrapper.gpu.probe import GpuReading, Probe, ProbeError, open_probe
from wrapper.gpu.report import Report, parse_gres_gpus, run_checks
from wrapper.gpu.resume import ResumeDecision, decide_resume

__all__ = ["CheckResult", "GpuReading", "Probe", "ProbeError", "Report", "ResumeDecision",
           "decide_resume", "open_probe", "parse_gres_gpus", "run_checks"]
