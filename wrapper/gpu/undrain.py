"""When ``jobwrap check --resume`` may return a drained node to service: a pure decision.

Only a node that jobwrap itself drained (its reason starts with ``jobwrap:``) and whose
checks now pass is resumed, unless it was drained as slow (``jobwrap: slow:``): a slow
node passes the checks, so an admin resumes it. A drain by anyone else, a node that is
also down, failing, in maintenance or waiting for a reboot, is left for a person.
"""

from __future__ import annotations

import re

from wrapper.fastdataclass import dataclass
from wrapper.slurm.commands import DRAIN_PREFIX, SLOW_DRAIN_PREFIX

_DRAIN_FLAGS = {"DRAIN", "DRAINED", "DRAINING"}
_HANDS_OFF = {"DOWN", "FAIL", "FAILING", "MAINT", "REBOOT_REQUESTED", "REBOOT_ISSUED",
              "POWER_DOWN", "POWERED_DOWN", "POWERING_DOWN", "NOT_RESPONDING"}
OUT_OF_SERVICE = _DRAIN_FLAGS | _HANDS_OFF  # a node no job is given (archive/slow.py)


@dataclass(frozen=True)
class ResumeDecision:
    resume: bool
    why: str


def decide_resume(state: str, reason: str, verdict: str) -> ResumeDecision:
    """``state``/``reason``: scontrol's State (``IDLE+DRAIN``) and Reason; ``verdict``: the
    report's (pass, warn or fail)."""
    flags = {f for f in re.split(r"[+\s]+", state.upper()) if f}
    reason = reason.strip()
    if not flags & _DRAIN_FLAGS:
        return ResumeDecision(False, f"not drained (State={state}): nothing to do")
    if not reason.startswith(DRAIN_PREFIX):
        return ResumeDecision(False, f"drained by someone else (Reason={reason or 'none'}): "
                              "left alone")
    if reason.startswith(SLOW_DRAIN_PREFIX):
        return ResumeDecision(False, f"drained by jobwrap as slow ({reason}): a slow node "
                              "passes the checks, so only an admin resumes it")
    blocking = sorted(flags & _HANDS_OFF)
    if blocking:
        return ResumeDecision(False, f"drained by jobwrap but also {'+'.join(blocking)} "
                              f"(State={state}): left for an admin")
    if verdict == "fail":
        return ResumeDecision(False, "drained by jobwrap and still unhealthy: stays drained")
    return ResumeDecision(True, f"drained by jobwrap ({reason}) and the checks now pass: "
                          "resumed")
