"""The epilog's decision path driven with fakes: every class x history x requeue-allowed.

The real evidence gathering (root's events, the supervisor's facts file, the job's
output read from disk, Slurm's record) runs against a temporary state folder and the
in-process ``FakeSlurm``; the GPU confirmer and the release spawner are fakes that
record their calls. What is checked is what root wrote (``attempt.end``) and did
(requeue, release argv, excluded node, the line in the job's output).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import pytest

from tests.support.epilog import CASES, JOB, EpilogCase
from wrapper.hooks.epilog import decide_attempt
from wrapper.hooks.services import Services
from wrapper.job import events as ev
from wrapper.job.store import JobStore
from wrapper.slurm.context import JobContext
from wrapper.slurm.fake import FakeSlurm

HISTORIES = ("first", "one_failure_before", "at_limit")
NOT_COUNTED = {"hardware", "node_failure", "preempted", "unchecked"}
NEVER_RETRIED = {"success", "cancelled", "staging", "cuda_oom"}


def expected(kind: str, history: str, allowed: bool) -> str:
    """The decision, written down from the policy's rules rather than computed by them."""
    if kind == "success":
        return "done"
    if kind == "unchecked" and allowed:
        return "requeue"  # its code did not run: it spends none of the job's restarts
    if kind in NEVER_RETRIED or not allowed or history == "at_limit":
        return "stop"
    if history == "one_failure_before" and kind not in NOT_COUNTED:
        return "stop"  # the same error twice, or no checkpoint progress in two attempts
    return "requeue"


@pytest.mark.parametrize("allowed", [True, False], ids=["requeue_allowed", "no_requeue"])
@pytest.mark.parametrize("history", HISTORIES)
@pytest.mark.parametrize("kind", sorted(CASES))
def test_epilog_decision_matrix(tmp_path: Path, epilog_case: EpilogCase, kind: str,
                                history: str, allowed: bool) -> None:
    ctx, cfg, state, record, slurm, gpu_failed = epilog_case(tmp_path, kind, history, allowed)
    spawned: list[Sequence[str]] = []
    services = Services(cfg, slurm_factory=lambda: slurm, spawn=spawned.append,
                        gpu_confirm=lambda node, gpus: [])
    decision, info = decide_attempt(ctx, cfg, state, record, slurm,
                                    gpu_check_failed=gpu_failed, gpu_checked=True,
                                    services=services)
    ends = [e for e in JobStore(state).root_events()
            if isinstance(e, ev.AttemptEnd) and e.attempt == ctx.attempt]
    assert len(ends) == 1
    assert ends[0].kind == kind, ends[0].detail
    assert decision.action == ends[0].decision == expected(kind, history, allowed), \
        decision.reason
    assert info["JobState"] == CASES[kind][1]
    requeued = decision.action == "requeue"
    assert bool(slurm.did("requeue")) == requeued
    assert bool(spawned) == requeued
    if requeued:
        argv = list(spawned[0])
        assert argv[argv.index("release") + 1] == JOB
        assert ("--exclude" in argv) == (kind in ("hardware", "node_failure", "unchecked"))
    told = Path(record.stdout).read_text()
    assert (f"jobwrap: attempt {ctx.attempt} ended: {kind}" in told) == (kind != "success")
    # A requeue that `jobwrap run` would have kept inside the allocation says so.
    assert ("`jobwrap run -- CMD`" in told) == (
        requeued and kind in ("killed", "user_error", "collective_timeout", "hang"))


def test_a_refused_requeue_is_recorded_not_raised(tmp_path: Path,
                                                 epilog_case: EpilogCase) -> None:
    ctx, cfg, state, record, slurm, _ = epilog_case(tmp_path, "node_failure", "first", True)
    slurm.refuse_requeue = "Requested operation is presently disabled"
    spawned: list[Sequence[str]] = []
    decide_attempt(ctx, cfg, state, record, slurm, gpu_check_failed=False,
                   services=Services(cfg, spawn=spawned.append))
    failed = [e for e in JobStore(state).root_events() if isinstance(e, ev.RequeueFailed)]
    assert [e.error for e in failed] == ["Requested operation is presently disabled"]
    assert spawned == []


def test_a_reported_gpu_fault_is_hardware_only_once_root_confirms(
        tmp_path: Path, epilog_case: EpilogCase) -> None:
    for confirmed in ([], ["xid gpu0: Xid 79"]):
        ctx, cfg, state, record, slurm, _ = epilog_case(tmp_path / str(len(confirmed)),
                                                        "user_error", "first", True)
        Path(record.stdout).write_text("Xid 79: GPU has fallen off the bus\n")
        asked: list[tuple[str, list[int]]] = []

        def confirm(node: str, gpus: Sequence[int], found: list[str] = confirmed,
                    asked: list[tuple[str, list[int]]] = asked) -> list[str]:
            asked.append((node, list(gpus)))
            return found

        decide_attempt(ctx, cfg, state, record, slurm, gpu_check_failed=False,
                                     gpu_checked=False,
                                     services=Services(cfg, gpu_confirm=confirm,
                                                       spawn=lambda argv: None))
        assert asked == [("n1", [0])]
        end = JobStore(state).last_end()
        assert isinstance(end, ev.AttemptEnd)
        assert end.kind == ("hardware" if confirmed else "user_error")
        kinds = {e.KIND for e in JobStore(state).root_events()}
        assert ("gpu.confirmed" if confirmed else "gpu.not_confirmed") in kinds


# n2 as the first node's epilog finds it, and what Slurm's accounting says of the attempt
N2_CASES: dict[str, tuple[dict[str, str | int], str | None]] = {
    "down": ({"State": "DOWN*", "Reason": "Not responding [slurm@2026-12-03T12:00:00]"}, None),
    # the node booted again during the attempt, and Slurm requeued the job for a lost node
    "rebooted, NODE_FAIL": ({"State": "IDLE", "Reason": "", "BootTime": 60}, "NODE_FAIL"),
    # a BootTime past the attempt's start (another clock's) and the job's own requeue:
    # Slurm did not end the attempt for a lost node, so no node was lost
    "rebooted, own requeue": ({"State": "IDLE", "Reason": "", "BootTime": 60}, "REQUEUED"),
    # its slurmd restarted during the attempt, and Slurm requeued the job for a lost node
    "slurmd back, NODE_FAIL": ({"State": "IDLE", "SlurmdStartTime": 60}, "NODE_FAIL"),
    # its slurmd restarted (an upgrade), then the job requeued itself: no node was lost
    "slurmd back, own requeue": ({"State": "IDLE", "SlurmdStartTime": 60}, "REQUEUED"),
    # no accounting to tell: a restarted slurmd stays a restart
    "slurmd back, no accounting": ({"State": "IDLE", "SlurmdStartTime": 60}, ""),
    "fine": ({"State": "IDLE", "Reason": "", "SlurmdStartTime": -3600}, None),
}


@pytest.mark.parametrize("n2", sorted(N2_CASES))
def test_a_job_slurm_requeued_itself_is_released_never_requeued_twice(
        tmp_path: Path, epilog_case: EpilogCase, n2: str) -> None:
    """n2's slurmd died: Slurm marked it down, ended the job and requeued it itself, so
    the surviving first node's epilog sees exit 0 and a PENDING job. That attempt is a
    node failure excluding n2 (not a success), and only the release is left to do; also
    when n2 is already back (it booted again, or its slurmd started again, and Slurm's
    accounting ended the attempt as NODE_FAIL). A slurmd that only restarted under the
    job, which then requeued itself, is no lost node (issue 37 item 1), nor is a node
    whose BootTime reads as during the attempt where Slurm did not end it as NODE_FAIL."""
    record_n2, accounted = N2_CASES[n2]
    lost = n2 in ("down", "rebooted, NODE_FAIL", "slurmd back, NODE_FAIL")
    ctx, cfg, state, record, _, _ = epilog_case(tmp_path, "success", "first", True)
    began = min(e.ts for e in JobStore(state).root_events() if isinstance(e, ev.PrologContext))
    n2_record = {k: datetime.fromtimestamp(began + v).isoformat(timespec="seconds")
                 if isinstance(v, int) else v for k, v in record_n2.items()}
    ctx = JobContext(hook="epilog", job_id=JOB, user="u", uid=os.getuid(), gid=os.getgid(),
                     node="n1", nodes=["n1", "n2"], gpus=[0], attempt=0, exit_code=0,
                     exit_signal=0)
    slurm = FakeSlurm(jobs={JOB: {"JobId": JOB, "JobState": "PENDING", "Restarts": "1",
                                  "Requeue": "1", "ExitCode": "0:0"}},
                      nodes={"n1": {"State": "MIXED"}, "n2": n2_record},
                      accounting={JOB: [(accounted, began + 120)]} if accounted else {})
    spawned: list[Sequence[str]] = []
    decision, _ = decide_attempt(ctx, cfg, state, record, slurm, gpu_check_failed=False,
                                 gpu_checked=True,
                                 services=Services(cfg, slurm_factory=lambda: slurm,
                                                   spawn=spawned.append))
    [end] = [e for e in JobStore(state).root_events() if isinstance(e, ev.AttemptEnd)]
    assert slurm.did("requeue") == []  # Slurm did it; a second requeue would be refused
    if lost:
        assert (end.kind, decision.action) == ("node_failure", "requeue"), end.detail
        assert {"down": "n2: DOWN* (Not responding)",
                "rebooted, NODE_FAIL": "n2: IDLE, back: it booted again at",
                "slurmd back, NODE_FAIL": "n2: IDLE, back: its slurmd started again at"
                }[n2] in end.detail, end.detail
    # Slurm's accounting is asked only when a node back (a slurmd restart, a reboot) is
    # all there is to go by
    assert bool(slurm.did("ended_attempts")) == n2.startswith(("slurmd back", "rebooted")), \
        slurm.calls
    # recorded as a requeue jobwrap did not ask for, then only released
    [external] = [e for e in JobStore(state).root_events()
                  if isinstance(e, ev.RequeuedWithoutJobwrap)]
    assert external.restarts == 1
    [argv] = spawned
    if lost:
        assert list(argv[argv.index("release"):]) == ["release", JOB, "--exclude", "n2"]
    else:  # no node lost: nothing says the attempt failed here, and nothing is excluded
        assert end.kind == "success" and "--exclude" not in argv
