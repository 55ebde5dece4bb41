"""The first node's decision, told of faults the watchers found on the job's other nodes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from wrapper.restart.classify import HARDWARE, SUCCESS, Classification
from wrapper.slurm import SlurmBackend
from wrapper.slurm.context import JobContext


def with_remote_faults(verdict: Classification, backend: SlurmBackend, ctx: JobContext,
                       root_events: Iterable[dict[str, Any]], slurm_job: Mapping[str, str],
                       ) -> tuple[Classification, dict[str, str]]:
    """``verdict`` as classed on this node, or ``hardware`` when a watcher on another node
    of the job found a GPU fault; with ``{node: reason}`` of those nodes (to exclude).

    A watcher ends the job with a signal, which the epilog's environment does not show
    (exit 0): Slurm's ``ExitCode`` (``0:15``) does. A job that really succeeded keeps its
    success even when another node is drained after it (its post-job check)."""
    signalled = not slurm_job.get("ExitCode", "0:0").endswith(":0")
    if verdict.kind == HARDWARE or (verdict.kind == SUCCESS and not signalled) \
            or len(ctx.nodes) < 2:
        return verdict, {}
    from wrapper.watch.remote import faults_elsewhere

    remote = faults_elsewhere(backend, ctx.nodes, ctx.node, ctx.attempt, root_events)
    if not remote:
        return verdict, {}
    where = "; ".join(f"{node}: {reason}" for node, reason in sorted(remote.items()))
    return Classification(HARDWARE, f"a GPU fault on another node of the job ({where})",
                          "gpu_fault", [*verdict.evidence, f"on this node: {verdict.kind}"]
                          ), remote
