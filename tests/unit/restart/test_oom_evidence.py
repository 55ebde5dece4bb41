"""Classification from evidence, on the lines real runs print, and root's OOM-kill facts.

The output lines are what a real 2-rank DDP job over gloo printed (torch 2.13, the
sandbox's srun) when one rank was SIGKILLed, and what Python prints for a user's bug.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from wrapper.restart.classify import (
    COLLECTIVE_TIMEOUT,
    HOST_OOM,
    KILLED,
    USER_ERROR,
    Evidence,
    classify,
    last_traceback,
)
from wrapper.restart.oom import cgroup_oom_kill, kernel_log_oom_kill, with_signals
from wrapper.restart.policy import PastAttempt, decide

# rank 0's end after rank 1 was SIGKILLed (a real gloo run), then srun's own line.
SURVIVOR = """\
rank 1: SIGKILL at step 5
[rank0]: Traceback (most recent call last):
[rank0]:   File "/home/jwtest/ddp_dcp.py", line 73, in <module>
[rank0]:     main()
[rank0]:   File "/home/jwtest/ddp_dcp.py", line 55, in main
[rank0]:     loss.backward()
[rank0]:   File "/opt/jobwrap/frameworks/lib/python3.11/site-packages/torch/_tensor.py", \
line 623, in backward
[rank0]:     torch.autograd.backward(
[rank0]:   File "/opt/jobwrap/frameworks/lib/python3.11/site-packages/torch/autograd/graph.py", \
line 979, in _engine_run_backward
[rank0]:     return Variable._execution_engine.run_backward(  # Calls into the C++ engine
[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] \
Read error [127.0.0.1]:24997: Connection reset by peer. This is typically caused by a \
remote worker hanging or bugs in the application.
"""
SRUN_KILLED = "srun: error: n2: task 1: Killed\nsrun: error: n1: task 0: Exited with exit code 1\n"
GLOO_CLOSED = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
               "Connection closed by peer [127.0.0.1]:29500\n")
GLOO_TIMEOUT = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
                "Timed out waiting 1800000ms for recv operation to complete\n")
USER_BUG = """\
Traceback (most recent call last):
  File "/home/jwtest/train.py", line 40, in <module>
    main()
  File "/home/jwtest/train.py", line 31, in main
    batch = load(step)
  File "/home/jwtest/data.py", line 12, in load
    return json.loads(text)
  File "/usr/lib/python3.11/json/__init__.py", line 346, in loads
    return _default_decoder.decode(s)
  File "/usr/lib/python3.11/json/decoder.py", line 355, in raw_decode
    raise JSONDecodeError("Expecting value", s, err.value) from None
json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)
"""


def test_a_rank_killed_by_sigkill_is_killed_not_user_error() -> None:
    # srun exits 128 + 9 when a task died of SIGKILL, whatever its peers exited with
    # (srun_job.c; the DDP end-to-end test sees it on the real sandbox)
    verdict = classify(Evidence(exit_code=137, output_tail=SURVIVOR + SRUN_KILLED))
    assert verdict.kind == KILLED and verdict.retryable
    # srun's line alone, with another exit status, is only the job's own words
    assert classify(Evidence(exit_code=1, output_tail=SURVIVOR + SRUN_KILLED)).kind != KILLED


def test_two_kills_in_a_row_are_not_the_same_error() -> None:
    first = classify(Evidence(exit_code=137, output_tail=SURVIVOR + SRUN_KILLED))
    history = [PastAttempt(0, first.kind, first.signature, 3, "/c/step_3")]
    second = decide(first, attempt=1, max_restarts=5, no_requeue=False, history=history,
                    checkpoint_step=6, checkpoint_path="/c/step_6", node="n2",
                    no_progress_limit=2)
    assert second.action == "requeue", second.reason
    # but a kill counts against progress: two with no new checkpoint stop
    stuck = decide(first, attempt=1, max_restarts=5, no_requeue=False, history=history,
                   checkpoint_step=3, checkpoint_path="/c/step_3", node="n2",
                   no_progress_limit=2)
    assert stuck.action == "stop" and "progress" in stuck.reason, stuck.reason


def test_sigkill_with_an_oom_kill_recorded_is_host_oom() -> None:
    verdict = classify(Evidence(exit_code=1, output_tail=SURVIVOR + SRUN_KILLED,
                                oom_kill="cgroup /sys/fs/cgroup/x/job_7: oom_kill 1"))
    assert verdict.kind == HOST_OOM and "oom_kill 1" in verdict.detail
    assert classify(Evidence(exit_code=0, exit_signal=9, slurm_state="OUT_OF_MEMORY")).kind \
        == HOST_OOM


@pytest.mark.parametrize("tail", [SURVIVOR, GLOO_CLOSED, GLOO_TIMEOUT])
def test_gloo_failures_without_a_kill_are_collective_timeouts(tail: str) -> None:
    verdict = classify(Evidence(exit_code=1, output_tail=tail))
    assert verdict.kind == COLLECTIVE_TIMEOUT and verdict.retryable


def test_a_traceback_is_user_error_signed_by_type_and_innermost_user_frame() -> None:
    verdict = classify(Evidence(exit_code=1, output_tail="step 3\n" + USER_BUG))
    assert verdict.kind == USER_ERROR
    assert verdict.signature == "traceback:json.decoder.JSONDecodeError:data.py:load:12"
    assert verdict.detail.startswith("json.decoder.JSONDecodeError: Expecting value")
    # The same bug on the next attempt, after other output: the same error.
    again = classify(Evidence(exit_code=1, output_tail="resumed at step 3\n" + USER_BUG))
    assert again.signature == verdict.signature


def test_rank_prefixed_traceback_is_parsed() -> None:
    assert last_traceback(SURVIVOR) == (
        "RuntimeError", "ddp_dcp.py:main:55", SURVIVOR.splitlines()[-1][9:][:200])
    assert last_traceback("no traceback here\n") is None


def test_cgroup_v2_memory_events_oom_kill(tmp_path: Path) -> None:
    scope = tmp_path / "system.slice" / "n1_slurmstepd.scope" / "job_42"
    scope.mkdir(parents=True)
    (scope / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n")
    assert cgroup_oom_kill("42", str(tmp_path)) == ""
    (scope / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    assert cgroup_oom_kill("42", str(tmp_path)) == f"cgroup {scope}: oom_kill 2"
    assert cgroup_oom_kill("4", str(tmp_path)) == ""  # job 4 is not job 42


def test_cgroup_v1_oom_control(tmp_path: Path) -> None:
    job = tmp_path / "memory" / "slurm" / "uid_1000" / "job_9"
    job.mkdir(parents=True)
    (job / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert cgroup_oom_kill("9", str(tmp_path)).endswith("oom_kill 1")


def test_kernel_log_oom_kill_of_the_job(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text(
        "6,1,2,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,"
        "mems_allowed=0,oom_memcg=/system.slice/slurmstepd.scope/job_77,task_memcg=/system."
        "slice/slurmstepd.scope/job_77/step_0/user/task_1,task=python3,pid=4242,uid=1001\n")
    assert kernel_log_oom_kill("77", str(log)) == \
        "kernel log: oom-kill of python3 in job_77's memory cgroup"
    assert kernel_log_oom_kill("7", str(log)) == ""
    assert kernel_log_oom_kill("77", str(tmp_path / "absent")) == ""


def test_with_signals_fills_the_evidence(tmp_path: Path) -> None:
    scope = tmp_path / "system.slice" / "slurmstepd.scope" / "job_5"
    scope.mkdir(parents=True)
    (scope / "memory.events").write_text("oom 1\noom_kill 1\n")
    base = Evidence(exit_code=137, output_tail=SRUN_KILLED)
    filled = with_signals(base, 5, cgroup_root=str(tmp_path), kmsg=os.devnull)
    assert filled.oom_kill and classify(filled).kind == HOST_OOM
    assert with_signals(base, "6", cgroup_root=str(tmp_path), kmsg=os.devnull) == base
    assert classify(base).kind == KILLED


def test_kernel_log_oom_kill_needs_the_kernels_own_record(tmp_path: Path) -> None:
    forged = ("oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/slurm/job_77,"
              "task_memcg=/slurm/job_77/step_0,task=python3,pid=1,uid=1001")
    log = tmp_path / "kmsg"
    log.write_text(f"6,1,2,-;python3[9]: segfault at 0 ip 0 sp 0 error 15 in {forged}[0+1]\n"
                   f"14,2,3,-;{forged}\n")
    assert kernel_log_oom_kill("77", str(log)) == ""
