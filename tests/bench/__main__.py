"""Benchmark runner: ``python -m tests.bench [NAME ...]``."""

from __future__ import annotations

import sys

from tests.bench import (
    archive_scale,
    ckpt_latest,
    faults,
    goodput,
    guard,
    hangs,
    job_start,
    node_loss,
    prolog_overhead,
    restart,
    staging,
    straggler,
    submit_lua,
)

BENCHMARKS = {
    "prolog-overhead": prolog_overhead.main,
    "ckpt-latest": ckpt_latest.main,
    "ckpt-latest-hf": ckpt_latest.hf_main,
    "ckpt-latest-dcp": ckpt_latest.dcp_main,
    "restart-requeue": restart.requeue_main,
    "restart-inplace": restart.inplace_main,
    "supervisor-cpu": restart.supervisor_cpu_main,
    "guard-scan": guard.scan_main,
    "guard-cpu": guard.cpu_main,
    "stage-large": staging.large_main,
    "stage-small": staging.small_main,
    "stage-cached": staging.cached_main,
    "submit-lua": submit_lua.main,
    "job-start": job_start.main,
    "goodput": goodput.main,
    "fault-detect": faults.fault_detect_main,
    "hang-detect": hangs.main,
    "hang-cadence": faults.hang_detect_main,
    "straggler": straggler.main,
    "watch-cpu": faults.watch_cpu_main,
    "archive-scale": archive_scale.main,
    "node-loss": node_loss.main,
}


def main(argv: list[str]) -> int:
    names = argv or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}",
              file=sys.stderr)
        return 2
    worst = 0
    for name in names:
        worst = max(worst, BENCHMARKS[name]())
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
