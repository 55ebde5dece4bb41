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
    assert this_attempt(APPENDED, 0) == APPENDED
    assert this_attempt(APPENDED, 2) == APPENDED
    assert this_attempt("jobwrap: attempt 12; resuming\nKilled\n", 1) == \
        "jobwrap: attempt 12; resuming\nKilled\n"
    assert this_attempt("jobwrap: attempt 1; no valid checkpoint\nKilled\n", 1) == "\nKilled\n"
