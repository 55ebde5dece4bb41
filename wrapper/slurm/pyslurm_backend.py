"""Optional pyslurm backend: reads job and node records through the Slurm C API.

pyslurm builds only against the exact Slurm MAJOR.MINOR it was released for, so it is
used only when it imports *and* matches the running Slurm; writes (drain, requeue)
stay on scontrol, whose behaviour is the same on every Slurm version.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from wrapper.slurm.commands import CliBackend
from wrapper.slurm.parse import check_job_id as _job_id
from wrapper.slurm.parse import check_node as _node


def major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def load_matching(slurm_version: Callable[[], str]) -> tuple[ModuleType | None, str]:
    """Import pyslurm if it matches the running Slurm; else (None, why not).

    ``slurm_version`` is asked only once pyslurm imports, so sites without pyslurm pay
    for no scontrol call.
    """
    try:
        import pyslurm
    except ImportError as exc:
        return None, f"pyslurm is not importable ({exc})"
    theirs = str(getattr(pyslurm, "__version__", ""))
    running = slurm_version()
    if major_minor(theirs) != major_minor(running):
        return None, f"pyslurm {theirs} does not match Slurm {running}"
    return pyslurm, ""


class PyslurmBackend(CliBackend):
    name = "pyslurm"

    def __init__(self, module: ModuleType, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pyslurm = module

    def job_info(self, job_id: str) -> dict[str, str]:
        job = self.pyslurm.Job.load(int(_job_id(job_id)))
        return {k: str(v) for k, v in job.to_dict().items()}

    def node_info(self, node: str) -> dict[str, str]:
        record = self.pyslurm.Node.load(_node(node))
        return {k: str(v) for k, v in record.to_dict().items()}
