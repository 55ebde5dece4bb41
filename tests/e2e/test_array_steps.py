"""The steps-only kill (a watcher's fault where a spare takes over, the supervisor's end of
a hang inside ``jobwrap run``) on array tasks, against this Slurm's own squeue and scancel.

squeue prints an array task's steps as ``ARRAY_TASK.STEP``, and the array's own id, which
one of its tasks keeps as its numeric id, lists every task's steps: the kill of one task's
steps must end those and only those, and never a batch script.
"""

from __future__ import annotations

from jobwrap_dev.sandbox.cluster import Cluster
from tests.support import poll
from wrapper.config import SlurmConfig
from wrapper.runner import Runner
from wrapper.slurm.commands import CliBackend

SCRIPT = """#!/bin/bash
srun --ntasks=1 sleep 300
echo "task $SLURM_ARRAY_TASK_ID: step over rc=$?"
sleep 1
"""


def running_tasks(runner: Runner, array: str) -> dict[str, str]:
    """Array task id -> its numeric job id, once both tasks run (else {})."""
    out = runner.run(["squeue", "-h", "-r", "-j", array, "-t", "R", "-o", "%K %A"],
                     timeout=20).stdout
    found = dict(line.split() for line in out.splitlines() if line.strip())
    return found if len(found) == 2 else {}


def test_the_steps_only_kill_ends_one_array_tasks_steps_alone(cluster: Cluster) -> None:
    runner = Runner(cluster.env())
    array = cluster.submit(SCRIPT, "--array=0-1", "--ntasks=1", name="array-steps.sh")
    backend = CliBackend(SlurmConfig(), runner)
    try:
        ids = poll("two running array tasks", lambda: running_tasks(runner, array), 60)
        # the task holding the array's own id first: its squeue -j lists both tasks' steps
        order = sorted(ids.values(), key=lambda j: j != array)
        assert array in order, (array, ids)  # the case this test is for is played
        running = poll("a running step in each task", lambda: all(
            backend.job_steps(j) for j in order) and {j: backend.job_steps(j) for j in order},
            60)
        assert running == {j: [f"{j}.0"] for j in order}, running
        out = {task: cluster.work / f"slurm-{array}_{task}.out" for task in ids}
        first, second = order
        task_of = {job: task for task, job in ids.items()}

        assert backend.kill_steps(first) == [f"{first}.0"]
        poll("the first task's batch script going on", lambda: out[task_of[first]].exists()
              and "step over" in out[task_of[first]].read_text(), 30)
        # the sibling's step still runs, and its batch script has not moved on
        assert backend.job_steps(second) == [f"{second}.0"]
        assert not out[task_of[second]].exists() or \
            "step over" not in out[task_of[second]].read_text()

        assert backend.kill_steps(second) == [f"{second}.0"]
        poll("the second task's batch script going on", lambda: out[task_of[second]].exists()
              and "step over" in out[task_of[second]].read_text(), 30)
        for job in order:  # each batch script ran on to its end: only steps were killed
            info = cluster.wait_job(job, timeout=60)
            assert info["JobState"] == "COMPLETED", info
    finally:
        runner.run(["scancel", array], timeout=20, check=False)


def test_ending_the_task_that_holds_the_arrays_id_ends_that_task_alone(
        cluster: Cluster) -> None:
    """The whole-job end (the supervisor's after a hang, a watcher's after a GPU fault:
    ``scancel --full --signal=KILL``) names the task holding the array's own id as A_T:
    that id, bare, is every task of the array to scancel (and to scontrol's requeue and
    updates, which the backend names the same way: tests/unit/slurm)."""
    runner = Runner(cluster.env())
    array = cluster.submit(SCRIPT, "--array=0-1", "--ntasks=1", name="array-end.sh")
    backend = CliBackend(SlurmConfig(), runner)
    try:
        ids = set(poll("two running array tasks", lambda: running_tasks(runner, array),
                       60).values())
        assert array in ids, (array, ids)  # the case this test is for is played
        sibling = next(j for j in ids if j != array)
        backend.signal_job(array, "KILL", full=True)
        ended = cluster.wait_job(array, timeout=60)
        assert ended["JobState"] in ("CANCELLED", "FAILED"), ended
        # the sibling still runs its step: it was never signalled
        assert cluster.job(sibling)["JobState"] == "RUNNING", cluster.job(sibling)
        assert backend.job_steps(sibling) == [f"{sibling}.0"]
    finally:
        runner.run(["scancel", array], timeout=20, check=False)
