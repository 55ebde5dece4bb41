"""A GPU fault under a running job: the one reading the supervisor, the node watchers and
root's epilog confirmation share.

Only the checks whose failure means the GPU is faulty *now* count (the others, such as
memory in use, are expected while a job runs). The probe and checks are the prolog's,
through the same seam (NVML, or the ``fake`` probe).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from wrapper.config import Config
from wrapper.gpu.checks import CheckResult

if TYPE_CHECKING:
    from wrapper.gpu.nvml import XidListener

FAULT_CHECKS = frozenset({"probe", "xid", "ecc", "row_remap", "retired_pages", "nvlink"})


def read(cfg: Config, node: str, gpus: Sequence[int], *,
         listener: XidListener | None = None) -> list[CheckResult]:
    """The fault checks that fail on ``gpus`` of ``node`` now (empty: healthy).
    ``listener``: a long-lived reader of NVML's Xid events (the node watcher's).

    A probe that does not work raises JobwrapError: jobwrap's problem, not the GPU's."""
    if not gpus:
        return []
    from wrapper.gpu.backend import open_probe
    from wrapper.gpu.report import run_checks

    probe = open_probe(cfg.gpu, node, listener=listener)
    try:
        report = run_checks(cfg, probe, phase="prolog", allocated=list(gpus),
                            configured_gres=None, env={}, target="gpu")
    finally:
        probe.close()
    return [r for r in report.failures if r.check in FAULT_CHECKS]


def describe(result: CheckResult) -> str:
    return f"{result.check} gpu{result.gpu_index}: {result.reason}"


def confirm(cfg: Config, node: str, gpus: Sequence[int]) -> list[str]:
    """Root's own probe of the job's GPUs: the faults it finds (empty: none confirmed).

    The same probe and fault checks as the supervisor's; a probe that does not work is
    jobwrap's problem and raises, it confirms nothing.
    """
    return [describe(r) for r in read(cfg, node, gpus)]
