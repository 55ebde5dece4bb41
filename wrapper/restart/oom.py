"""Root's own evidence of how an attempt died, for the classifier: OOM kills of the job.

Only facts the job's user cannot forge: the kernel's counters in the job's memory cgroup
(``memory.events`` ``oom_kill`` under cgroup v2, ``memory.oom_control`` under v1, in the
places Slurm's cgroup plugins make them) and the kernel log's ``oom-kill:`` records whose
memory cgroup is the job's. Every read is bounded and non-blocking; anything unreadable
is no evidence, never an error. Called once by the epilog: ``with_signals(evidence, job)``.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re

from wrapper.restart.classify import Evidence

CGROUP_ROOT = "/sys/fs/cgroup"
KMSG = "/dev/kmsg"
_READ_LIMIT = 4096
_KMSG_RECORDS = 20_000  # the kernel's ring buffer holds far fewer of these
# Where Slurm's cgroup plugins put a job (v2: slurmstepd's scope, one per slurmd in a
# multi-slurmd test cluster; v1: the memory controller's slurm/uid_U/job_J).
_CGROUP_PATTERNS = ("system.slice/slurmstepd.scope/job_{job}/memory.events",
                    "system.slice/*slurmstepd.scope/job_{job}/memory.events",
                    "memory/slurm*/uid_*/job_{job}/memory.oom_control")


def with_signals(evidence: Evidence, job_id: str | int, *, cgroup_root: str = CGROUP_ROOT,
                 kmsg: str = KMSG) -> Evidence:
    """``evidence`` with ``oom_kill`` filled in when root saw an OOM kill of the job."""
    job = str(job_id)
    if not job.isdigit():
        return evidence
    found = cgroup_oom_kill(job, cgroup_root) or kernel_log_oom_kill(job, kmsg)
    return dataclasses.replace(evidence, oom_kill=found) if found else evidence


def cgroup_oom_kill(job: str, cgroup_root: str = CGROUP_ROOT) -> str:
    """"cgroup PATH: oom_kill N" when the job's memory cgroup counted an OOM kill, else ""."""
    for pattern in _CGROUP_PATTERNS:
        for path in sorted(glob.glob(os.path.join(cgroup_root, pattern.format(job=job))))[:8]:
            count = _oom_kill_count(path)
            if count:
                return f"cgroup {os.path.dirname(path)}: oom_kill {count}"
    return ""


def _oom_kill_count(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        text = os.read(fd, _READ_LIMIT).decode("ascii", "replace")
    except OSError:
        return 0
    finally:
        os.close(fd)
    match = re.search(r"^oom_kill (\d+)$", text, re.M)
    return int(match.group(1)) if match else 0


def kernel_log_oom_kill(job: str, kmsg: str = KMSG) -> str:
    """The kernel log's last ``oom-kill:`` record naming the job's memory cgroup, else "".
    Only a record the kernel wrote that begins with ``oom-kill:`` counts: the same text
    in a file or process name a user chose (a segfault record's) is not one
    (see :mod:`wrapper.gpu.kmsg`)."""
    import itertools

    from wrapper.gpu.kmsg import parse_record, read_records

    mine = re.compile(r"oom-kill:.*\b(?:oom_memcg|task_memcg)=\S*/job_" + re.escape(job) +
                      r"(?:[/,]|$)")
    found = ""
    try:
        for line in itertools.islice(read_records(kmsg), _KMSG_RECORDS):
            record = parse_record(line)
            if record is None or not record[1].startswith("oom-kill:"):
                continue
            if mine.match(record[1]):
                task = re.search(r"\btask=([^,\s]+)", record[1])
                found = "kernel log: oom-kill of " + (task.group(1) if task else "a task") + \
                    f" in job_{job}'s memory cgroup"
    except OSError:
        return found
    return found
