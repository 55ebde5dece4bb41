"""Optional pyslurm backend: reads job and node records through the Slurm C API.

pyslurm builds only against the exact Slurm MAJOR.MINOR it was released for, so it is
used only when it imports *and* matches the running Slurm; writes (drain, requeue)
stay on scontrol, whose behaviour is the same on every Slurm version.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from wrapper.errors import SlurmError
from wrapper.slurm.commands import CliBackend
from wrapper.slurm.parse import check_job_id as _job_id
from wrapper.slurm.parse import check_node as _node
from wrapper.slurm.records import limit_text


def major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def load_matching(slurm_version: Callable[[], str]) -> tuple[ModuleType | None, str]:
    """Import pyslurm if it matches the running Slurm; else (None, why not).

    ``slurm_version`` is asked only once pyslurm imports, so sites without pyslurm pay
    for no scontrol call.
    """
    import importlib.util
    import os
    import sys

    loaded = "pyslurm" in sys.modules  # imported once already: libslurm is up
    if not loaded and importlib.util.find_spec("pyslurm") is None:
        return None, "pyslurm is not installed"
    conf = os.environ.get("SLURM_CONF", "")
    readable = bool(conf) and os.path.isfile(conf) and os.access(conf, os.R_OK)
    if not loaded and not readable:
        # libslurm reads it as pyslurm imports, and where it cannot, retries for a minute
        # and then exits the process: a hook would die. slurmd always sets it for hooks.
        return None, f"SLURM_CONF={conf!r} names no readable slurm.conf"
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
    """Reads (job and node records, the batch script) through pyslurm's C API: one RPC
    each, no process start; writes stay on scontrol. Records come out with the field
    names ``scontrol show`` prints, so callers cannot tell the backends apart."""

    name = "pyslurm"

    def __init__(self, module: ModuleType, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pyslurm = module

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as exc:  # pyslurm.RPCError and friends: Slurm said no
            raise SlurmError(f"pyslurm {what}: {exc}") from None

    def job_info(self, job_id: str) -> dict[str, str]:
        if "_" in _job_id(job_id):  # an array task as A_T: pyslurm loads by job id only
            return super().job_info(job_id)
        job = self._call(f"Job.load({job_id})",
                         lambda: self.pyslurm.Job.load(int(_job_id(job_id))))
        return job_fields(job)

    def batch_script(self, job_id: str) -> str:
        job = int(_job_id(job_id))
        return str(self._call(f"Job({job_id}).get_batch_script()",
                              lambda: self.pyslurm.Job(job).get_batch_script()) or "")

    def node_info(self, node: str) -> dict[str, str]:
        record = self._call(f"Node.load({node})", lambda: self.pyslurm.Node.load(_node(node)))
        gres = getattr(record, "configured_gres", None) or {}
        return {"NodeName": _text(record.name), "State": _text(record.state),
                "Reason": _text(record.reason),
                "Gres": ",".join(f"{k}:{v}" for k, v in gres.items())
                if isinstance(gres, dict) else _text(gres),
                "Partitions": ",".join(record.partitions or []),
                "SlurmdStartTime": _when(getattr(record, "slurmd_start_time", None)),
                "BootTime": _when(getattr(record, "boot_time", None))}


def _when(value: Any) -> str:
    """A pyslurm time (seconds since the epoch, or None) as scontrol prints it."""
    from datetime import datetime

    try:
        return datetime.fromtimestamp(int(value)).isoformat(timespec="seconds") \
            if value else "Unknown"
    except (TypeError, ValueError, OverflowError, OSError):
        return "Unknown"


def job_fields(job: Any) -> dict[str, str]:
    """A pyslurm Job as the fields ``scontrol show job`` prints (records.from_json_job)."""
    limit = job.time_limit
    out = {
        "JobId": str(job.id), "JobName": _text(job.name),
        "UserId": f"{_text(job.user_name)}({_text(job.user_id)})",
        "JobState": _text(job.state), "Reason": _text(job.state_reason, "None"),
        "Requeue": "1" if job.is_requeueable else "0",
        "Restarts": _text(job.requeue_count, "0"),
        "ExitCode": f"{job.exit_code or 0}:{job.exit_code_signal or 0}",
        "TimeLimit": limit_text(None if limit is None else int(limit)),
        "StartTime": _when(job.start_time), "EndTime": _when(job.end_time),
        "SubmitTime": _when(job.submit_time),
        "Partition": _text(job.partition), "NodeList": _text(job.allocated_nodes),
        "BatchHost": _text(job.batch_host), "ExcNodeList": _text(job.excluded_nodes, "(null)"),
        "Account": _text(job.account, "(null)"), "Command": _text(job.command),
        "WorkDir": _text(job.working_directory), "Comment": _text(job.comment),
        "StdOut": _text(job.standard_output), "StdErr": _text(job.standard_error),
        "StdIn": _text(job.standard_input),
        # what a rerun asks for again (archive/rerun.py)
        "NumNodes": _text(getattr(job, "num_nodes", None)),
        "NumTasks": _text(getattr(job, "ntasks", None)),
        "CPUs/Task": _text(getattr(job, "cpus_per_task", None)),
        "QOS": _text(getattr(job, "qos", None), "(null)"),
        "AdminComment": _text(getattr(job, "admin_comment", None)),
        "Extra": _text(getattr(job, "extra", None)),
    }
    if job.array_id:
        out["ArrayJobId"] = str(job.array_id)
        out["ArrayTaskId"] = _text(job.array_task_id)
    return out


def _text(value: Any, default: str = "") -> str:
    return default if value is None or value == "" else str(value)
