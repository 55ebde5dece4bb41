"""The line job_submit.lua puts into a batch script, and taking it out again.

With ``[restart] batch_wrapper`` set, job_submit.lua adds one line to every batch script
of a POSIX shell, where its header ends: run by the batch step, it execs
``jobwrap run -- INTERPRETER "$0" "$@"``, which runs the same script again under its
restart policy (the line's test lets that run pass: ``jobwrap run`` exports
``JOBWRAP_RUN`` as the job's id). So a failure ``jobwrap run`` can restart in place does
not leave the allocation, with no change to the script (docs/recovery.md). Slurm then
keeps the script with the line in; the archive, and so ``jobwrap rerun``, keep the
script as its user wrote it.
"""

from __future__ import annotations

# job_submit.lua's WRAP_MARK and the test its line starts with (held to it by
# tests/unit/submit/test_batch_wrap.py).
MARK = "# jobwrap: restarts inside the allocation (job_submit.lua)"
TEST = '[ "${JOBWRAP_RUN:-}" = "${SLURM_JOB_ID:-}" ] || '


def unwrap(script: str) -> str:
    """``script`` without job_submit.lua's line (unchanged when it has none)."""
    at = script.find(MARK)
    if at < 0:
        return script
    start = script.rfind("\n", 0, at) + 1
    end = script.find("\n", at)
    end = len(script) if end < 0 else end + 1
    line = script[start:end].rstrip("\n")
    if not (line.startswith(TEST) and line.endswith(MARK)):
        return script
    return script[:start] + script[end:]
