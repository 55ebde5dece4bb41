"""``jobwrap check --resume``: when a drained node goes back to service (a pure decision)."""

from __future__ import annotations

import pytest

from wrapper.gpu.undrain import decide_resume

REASON = "jobwrap: row_remap gpu1(GPU-11a2b3c4): row remapping failed [root@2025-01-01T10:00:00]"


@pytest.mark.parametrize(("state", "reason", "verdict", "resume", "words"), [
    ("IDLE+DRAIN", REASON, "pass", True, "checks now pass: resumed"),
    ("IDLE+DRAIN", REASON, "warn", True, "resumed"),
    ("MIXED+DRAIN", REASON, "pass", True, "resumed"),
    ("IDLE+DRAIN", REASON, "fail", False, "still unhealthy: stays drained"),
    ("IDLE+DRAIN", "bad fan, ticket 42 [admin@2025-01-01]", "pass", False,
     "drained by someone else (Reason=bad fan, ticket 42"),
    ("IDLE+DRAIN", "", "pass", False, "drained by someone else (Reason=none)"),
    ("IDLE+DRAIN", "JOBWRAP: lowercase prefix only", "pass", False, "someone else"),
    ("IDLE", "", "pass", False, "not drained (State=IDLE): nothing to do"),
    ("ALLOCATED", REASON, "pass", False, "not drained"),
    ("DOWN+DRAIN+NOT_RESPONDING", REASON, "pass", False,
     "but also DOWN+NOT_RESPONDING (State=DOWN+DRAIN+NOT_RESPONDING): left for an admin"),
    ("IDLE+DRAIN+MAINT", REASON, "pass", False, "also MAINT"),
    ("IDLE+DRAIN+REBOOT_REQUESTED", REASON, "pass", False, "also REBOOT_REQUESTED"),
])
def test_only_jobwraps_own_drains_of_healthy_nodes_are_resumed(
        state: str, reason: str, verdict: str, resume: bool, words: str) -> None:
    decision = decide_resume(state, reason, verdict)
    assert decision.resume is resume
    assert words in decision.why
