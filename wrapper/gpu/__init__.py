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

from __future__ import annotations

import importlib
from typing import Any

# Names are loaded on first use: the prolog imports only what it calls.
_EXPORTS = {
    "CheckResult": "wrapper.gpu.checks", "GpuReading": "wrapper.gpu.probe",
    "Probe": "wrapper.gpu.probe", "ProbeError": "wrapper.gpu.probe",
    "open_probe": "wrapper.gpu.backend", "Report": "wrapper.gpu.report",
    "run_checks": "wrapper.gpu.report",
    "ResumeDecision": "wrapper.gpu.undrain", "decide_resume": "wrapper.gpu.undrain",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'wrapper.gpu' has no attribute {name!r}")
