from __future__ import annotations

import pytest

from wrapper.restart.classify import Evidence, classify
from wrapper.restart.policy import PastAttempt, decide

SEGV_THEN_GLOO = (
    "step 41 t=1.0\n"
    "srun: error: n3: task 1: Segmentation fault (core dumped)\n"
    "[rank0]: Traceback (most recent call last):\n"
    '[rank0]:   File "/home/u/train.py", line 88, in <module>\n'
    "[rank0]:     loss.backward()\n"
    "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error "
    "[127.0.0.1]:20417: Connection reset by peer\n"
    "srun: error: n2: task 0: Exited with exit code 1\n")


@pytest.mark.parametrize(
    ("evidence", "kind"),
    [
        (Evidence(exit_code=0, exit_signal=0, slurm_state="COMPLETED"), "success"),
        (Evidence(exit_code=0, exit_signal=0), "success"),
        (Evidence(exit_code=0, exit_signal=9, slurm_state="NODE_FAIL"), "node_failure"),
        (Evidence(exit_code=0, exit_signal=15, slurm_state="PREEMPTED"), "preempted"),
        (Evidence(exit_code=0, exit_signal=9, supervisor_events=("gpu.fault",),
                  gpu_check_failed=True), "hardware"),
        # a reported GPU fault root's own check did not confirm is not hardware
        (Evidence(exit_code=0, exit_signal=9, supervisor_events=("gpu.fault",)), "killed"),
        (Evidence(exit_code=1, gpu_check_failed=True), "hardware"),
        (Evidence(exit_code=0, exit_signal=9, supervisor_events=("checkpoint", "hang")), "hang"),
        # a hang whose steps alone were ended, restarted in place by jobwrap run: the
        # attempt is what its command made of it; a hang after that one ended the job
        (Evidence(exit_code=0, exit_signal=0, slurm_state="COMPLETED",
                  supervisor_events=("hang", "hang.in_place")), "success"),
        (Evidence(exit_code=0, exit_signal=9,
                  supervisor_events=("hang", "hang.in_place", "hang")), "hang"),
        # jobwrap run's brakes stopped after the in-place kill and passed on its SIGKILL:
        # the hang's doing, not a kill from outside (which would be retried)
        (Evidence(exit_code=137, supervisor_events=("hang", "hang.in_place")), "hang"),
        (Evidence(exit_code=1, supervisor_events=("hang", "hang.in_place"),
                  output_tail="Traceback (most recent call last):\n  File \"t.py\", "
                              "line 1, in <module>\nValueError: x\n"), "user_error"),
        (Evidence(exit_code=0, exit_signal=15, slurm_state="TIMEOUT"), "walltime"),
        (Evidence(exit_code=0, exit_signal=9, slurm_state="OUT_OF_MEMORY"), "host_oom"),
        (Evidence(exit_code=0, exit_signal=15, slurm_state="CANCELLED"), "cancelled"),
        (Evidence(exit_code=1, output_tail="x\ntorch.OutOfMemoryError: CUDA out of memory. "
                  "Tried to allocate 2.00 GiB\n"), "cuda_oom"),
        (Evidence(exit_code=1, output_tail="[rank3]:[E ProcessGroupNCCL.cpp:563] Watchdog "
                  "caught collective operation timeout: WorkNCCL(SeqNum=1)\n"),
         "collective_timeout"),
        (Evidence(exit_code=1, output_tail="NVRM: Xid (PCI:0000:3b:00): 79, pid=123, GPU has "
                  "fallen off the bus.\n", gpu_check_failed=True), "hardware"),
        (Evidence(exit_code=1, output_tail="NVRM: Xid (PCI:0000:3b:00): 79, pid=123, GPU has "
                  "fallen off the bus.\n"), "user_error"),
        (Evidence(exit_code=137, output_tail="step 4\n"), "killed"),
        # the rank that crashed is the cause; its peer's gloo error after it is not
        (Evidence(exit_code=139, output_tail=SEGV_THEN_GLOO), "user_error"),
        # NCCL's watchdog aborts a rank after a collective timed out: still the timeout
        (Evidence(exit_code=134, output_tail="[rank1]:[E ProcessGroupNCCL.cpp:563] Watchdog "
                  "caught collective operation timeout: WorkNCCL(SeqNum=9)\n"
                  "srun: error: n2: task 1: Aborted (core dumped)\n"), "collective_timeout"),
        (Evidence(exit_code=1, output_tail="Traceback...\nValueError: bad shape (3, 4)\n"),
         "user_error"),
    ],
)
def test_classification_table(evidence: Evidence, kind: str) -> None:
    assert classify(evidence).kind == kind


def test_same_error_with_other_numbers_has_the_same_signature() -> None:
    a = classify(Evidence(exit_code=1, output_tail="ValueError: bad shape (3, 4) at 0x7f3a\n"))
    b = classify(Evidence(exit_code=1, output_tail="ValueError: bad shape (5, 6) at 0x9c2e\n"))
    c = classify(Evidence(exit_code=1, output_tail="KeyError: 'lr'\n"))
    assert a.signature == b.signature != c.signature
    assert "ValueError: bad shape" in a.detail


def decision(kind_evidence: Evidence, *, attempt: int = 0, history: list[PastAttempt] | None
             = None, step: int | None = 10, max_restarts: int = 3, no_requeue: bool = False):
    return decide(classify(kind_evidence), attempt=attempt, max_restarts=max_restarts,
                  no_requeue=no_requeue, history=history or [], checkpoint_step=step,
                  checkpoint_path="/ck/step10" if step else None, node="n1")


USER_ERR = Evidence(exit_code=3, output_tail="RuntimeError: boom\n")


def test_success_is_never_requeued() -> None:
    assert decision(Evidence(exit_code=0, slurm_state="COMPLETED")).action == "done"


def test_first_failure_is_requeued_and_says_where_it_resumes() -> None:
    d = decision(USER_ERR)
    assert d.requeue
    assert "requeued as attempt 1 of at most 3; resumes from /ck/step10" in d.reason


def test_restart_limit() -> None:
    d = decision(USER_ERR, attempt=3, history=[PastAttempt(2, "hang", "hang", 5)])
    assert d.action == "stop" and "restart limit reached (3 of --max-restarts=3)" in d.reason


def test_same_user_error_twice_stops() -> None:
    first = classify(USER_ERR)
    d = decision(USER_ERR, attempt=1, step=20,
                 history=[PastAttempt(0, first.kind, first.signature, 10)])
    assert d.action == "stop" and "the same error ended attempts 0 and 1" in d.reason


def test_no_checkpoint_progress_stops() -> None:
    d = decision(Evidence(exit_code=0, exit_signal=9, supervisor_events=("hang",)), attempt=1,
                 step=10, history=[PastAttempt(0, "user_error", "exit:1:0:x", 10)])
    assert d.action == "stop" and "no checkpoint progress in the last 2 attempts" in d.reason


def test_progress_keeps_retrying() -> None:
    d = decision(Evidence(exit_code=0, exit_signal=9, supervisor_events=("hang",)), attempt=1,
                 step=20, history=[PastAttempt(0, "user_error", "exit:1:0:x", 10)])
    assert d.requeue


def test_hardware_faults_do_not_count_against_progress_and_exclude_the_node() -> None:
    d = decision(Evidence(exit_code=0, exit_signal=9, supervisor_events=("gpu.fault",),
                          gpu_check_failed=True), attempt=1, step=10,
                 history=[PastAttempt(0, "hardware", "gpu_fault", 10)])
    assert d.requeue and d.exclude_nodes == ["n1"]


def test_no_requeue_and_cancel_and_cuda_oom_stop() -> None:
    assert decision(USER_ERR, no_requeue=True).action == "stop"
    assert decision(Evidence(exit_code=0, exit_signal=15, slurm_state="CANCELLED")).action \
        == "stop"
    oom = decision(Evidence(exit_code=1, output_tail="CUDA out of memory\n"))
    assert oom.action == "stop" and "a retry would fail the same way" in oom.reason


def test_forged_gpu_claims_neither_exclude_the_node_nor_spare_the_job() -> None:
    # The job prints a GPU error and its own event file says gpu.fault: root's check passed.
    forged = Evidence(exit_code=1, output_tail="CUDA error: uncorrectable ECC error "
                      "encountered\n", unconfirmed=("gpu.fault in the job's own event file",))
    verdict = classify(forged)
    assert verdict.kind == "user_error"
    assert "not confirmed by root: gpu.fault in the job's own event file, the GPU error in " \
        "the output" in verdict.detail
    d = decision(forged, attempt=1, step=10,
                 history=[PastAttempt(0, "user_error", "exit:1:0:x", 10)])
    assert d.exclude_nodes == [] and d.action == "stop"  # it counts against its progress


def test_hang_counts_only_from_the_supervisors_channel() -> None:
    claimed = Evidence(exit_code=1, unconfirmed=("hang in the job's own event file",))
    assert classify(claimed).kind == "user_error"
    assert classify(Evidence(exit_code=0, exit_signal=9, supervisor_events=("hang",))).kind \
        == "hang"


def test_a_crash_names_the_rank_that_crashed_not_its_peer() -> None:
    verdict = classify(Evidence(exit_code=139, output_tail=SEGV_THEN_GLOO))
    assert verdict.detail == "a rank crashed: srun: error: n3: task 1: Segmentation fault " \
        "(core dumped)", verdict
    again = classify(Evidence(exit_code=139, output_tail=SEGV_THEN_GLOO.replace(
        "n3: task 1", "n4: task 3")))
    assert again.signature == verdict.signature  # the same crash on another node
    torchrun = classify(Evidence(exit_code=1, output_tail=(
        "torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -11)\n"
        "Signal 11 (SIGSEGV) received by PID 4242\n")))
    assert torchrun.kind == "user_error" and "SIGSEGV" in torchrun.detail


@pytest.mark.parametrize("tail", ["Killed\n", "srun: error: n2: task 1: Killed\n",
                                  "/var/spool/slurmd/job42/slurm_script: line 3: 99 Killed\n"])
def test_a_killed_line_in_the_output_alone_is_not_a_kill(tail: str) -> None:
    """Issue 22, item 5: ``echo Killed; exit 1`` was classed killed (not the job's fault)
    and dodged the same-error and no-progress stops. The job's words alone are its own."""
    first = classify(Evidence(exit_code=1, output_tail=tail))
    assert first.kind == "user_error"
    again = decide(classify(Evidence(exit_code=1, output_tail=tail)), attempt=1,
                   max_restarts=1000, no_requeue=False, node="n1", checkpoint_step=None,
                   checkpoint_path=None,
                   history=[PastAttempt(0, first.kind, first.signature, None)])
    assert again.action == "stop", again


def test_real_kills_with_no_progress_stop() -> None:
    """A kill (exit 137, SIGKILL) is retried, but counts against the job's progress: a
    job can kill itself, so it may not switch off the no-progress brake."""
    killed = classify(Evidence(exit_code=137, output_tail="step 4\n"))
    assert killed.kind == "killed"
    assert decide(killed, attempt=0, max_restarts=1000, no_requeue=False, node="n1",
                  history=[], checkpoint_step=4, checkpoint_path="c4").requeue
    stop = decide(killed, attempt=1, max_restarts=1000, no_requeue=False, node="n1",
                  history=[PastAttempt(0, "killed", "killed", 4)], checkpoint_step=4,
                  checkpoint_path="c4")
    assert stop.action == "stop" and "no checkpoint progress" in stop.reason, stop


@pytest.mark.parametrize("tail", [
    "Out of memory: Killed process 4242 (python) total-vm:1234kB\n",
    "oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/slurm_n1/uid_1001/job_7\n",
    "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
    "MemoryError\n"])
def test_an_oom_message_without_an_oom_kill_is_not_host_oom(tail: str) -> None:
    """Issue 24, item 2: host_oom rests on root's facts (Slurm's OUT_OF_MEMORY, the job's
    memory cgroup, the kernel's own log), not on words the job can print."""
    said = classify(Evidence(exit_code=1, output_tail=tail))
    assert said.kind == "user_error", said
    assert "out-of-memory kill in the output" in said.detail or "MemoryError" in said.detail
    seen = classify(Evidence(exit_code=1, output_tail=tail, oom_kill="cgroup X: oom_kill 1"))
    assert seen.kind == "host_oom"
    assert classify(Evidence(exit_code=0, exit_signal=9, slurm_state="OUT_OF_MEMORY",
                             output_tail=tail)).kind == "host_oom"


CANCEL = "slurmstepd-n1: error: *** JOB 77 ON n1 CANCELLED AT 2026-12-04T23:29:51 ***\n"


@pytest.mark.parametrize(("code", "tail", "extra", "kind"), [
    (0, CANCEL, {}, "cancelled"),  # Slurm hands the epilog exit 0 for a cancelled job
    (143, CANCEL, {}, "cancelled"),  # stopped, never requeued
    (0, CANCEL.replace("JOB 77", "JOB 78"), {}, "success"),  # another job's line
    (0, CANCEL.replace(" ***\n", " DUE TO JOB REQUEUE ***\n"), {}, "success"),
    (0, CANCEL.replace(" ***\n", " DUE TO TIME LIMIT ***\n"), {}, "success"),
    (0, CANCEL.replace(" ***\n", " DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***\n"),
     {}, "success"),
    # Slurm 25.11's words for the same cancel
    (0, CANCEL.replace(" ***\n", " DUE to SIGNAL Terminated ***\n"), {}, "cancelled"),
    (0, CANCEL.replace(" ***\n", " DUE TO TASK FAILURE ***\n"), {}, "cancelled"),
    (0, "[2026-12-05T01:42:17.687] error: *** JOB 77 ON n1 CANCELLED AT "
        "2026-12-05T01:42:17 DUE to SIGNAL Terminated ***\n", {}, "cancelled"),
    (0, CANCEL.replace("JOB 77", "STEP 77.0"), {}, "success"),  # a step, not the job
    (0, "echo " + CANCEL, {}, "success"),  # not at the start of a line
    (0, CANCEL, {"slurm_state": "COMPLETED"}, "success"),  # Slurm's record says otherwise
    (0, CANCEL, {"slurm_state": "TIMEOUT"}, "walltime"),
    (1, CANCEL, {"supervisor_events": ("gpu.fault",)}, "user_error"),  # the supervisor's end
])
def test_a_cancel_is_told_by_slurmstepds_line_for_this_job(code: int, tail: str,
                                                          extra: dict, kind: str) -> None:
    verdict = classify(Evidence(exit_code=code, output_tail=tail, job_id="77", **extra))
    assert verdict.kind == kind, verdict
    assert not verdict.retryable or kind != "cancelled"


def test_a_requeue_just_before_the_limit_is_walltime_not_success() -> None:
    verdict = classify(Evidence(exit_code=0, requeued_before_limit_s=41.6))
    assert (verdict.kind, verdict.retryable) == ("walltime", True)
    assert "requeued 42 s before its time limit" in verdict.detail
    assert classify(Evidence(exit_code=0, slurm_state="CANCELLED",
                             requeued_before_limit_s=5.0)).kind == "cancelled"
