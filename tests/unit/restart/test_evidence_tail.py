"""The epilog judges an attempt by what that attempt wrote, not by an earlier one's output
(``--open-mode=append`` keeps every attempt's words in one file)."""

from __future__ import annotations

from wrapper.restart.classify import Evidence, classify
from wrapper.restart.evidence import this_attempt

APPENDED = """rank 0: step 59
srun: error: n2: task 1: Killed
jobwrap: attempt 0 ended: killed (output says: srun: error: n2: task 1: Killed). Requeued
jobwrap: attempt 1 after killed (output says: srun: error: n2: task 1: Killed); resuming
rank 0: step 75
srun: error: n2: task 1: Segmentation fault
srun: error: n1: task 0: Terminated
"""


def test_an_earlier_attempts_killed_line_does_not_class_a_later_segfault() -> None:
    # attempt 0 really was killed (exit 137); attempt 1's segfault is judged on its own
    assert classify(Evidence(exit_code=137, output_tail=this_attempt(APPENDED, 0))).kind \
        == "killed"
    mine = this_attempt(APPENDED, 1)
    assert mine == "\nrank 0: step 75\nsrun: error: n2: task 1: Segmentation fault\n" \
        "srun: error: n1: task 0: Terminated\n"
    assert classify(Evidence(exit_code=143, output_tail=mine)).kind == "user_error"


def test_without_this_attempts_banner_the_whole_tail_counts() -> None:
    jobs_words = "".join(line for line in APPENDED.splitlines(keepends=True)
                         if not line.startswith("jobwrap: "))  # jobwrap's lines are not
    assert this_attempt(APPENDED, 0) == jobs_words
    assert this_attempt(APPENDED, 2) == jobs_words
    assert this_attempt("jobwrap: attempt 12; resuming\nKilled\n", 1) == "Killed\n"
    assert this_attempt("jobwrap: attempt 1; no valid checkpoint\nKilled\n", 1) == "\nKilled\n"


def test_jobwraps_own_lines_are_not_the_jobs_words() -> None:
    # jobwrap run reports the Xid it moved away from; the job then failed for its own
    # reason, and its own last error is what the verdict names
    tail = ("jobwrap run: n2: jobwrap: xid gpu0(GPU-a): Xid 79 (GPU has fallen off the bus); "
            "gave it back and restarted on n1,n3\n"
            "RuntimeError: loss is nan\n"
            "jobwrap run: attempt 2 ended: user_error (exit 1); stopping\n")
    verdict = classify(Evidence(exit_code=1, output_tail=this_attempt(tail, 0)))
    assert verdict.kind == "user_error" and "RuntimeError: loss is nan" in verdict.detail
    assert "not confirmed by root" not in verdict.detail  # no GPU claim was read
