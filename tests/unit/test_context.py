from __future__ import annotations

import pytest

from wrapper.errors import NotUnderSlurm
from wrapper.slurm.context import from_env

# What Slurm 22.05 gives the prolog and the epilog (SLURM-LOCAL.md).
PROLOG_ENV = {
    "SLURM_JOB_ID": "17", "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "1001",
    "SLURM_JOB_GID": "1001", "SLURM_JOB_PARTITION": "debug", "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NODELIST": "n[1-2]", "SLURMD_NODENAME": "n2", "SLURM_JOB_GPUS": "0,1",
    "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_WORK_DIR": "/home/alice",
    "SLURM_JOB_STDOUT": "job-%j.out", "SLURM_JOB_RESTART_COUNT": "2",
    "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
}


def test_prolog_context() -> None:
    ctx = from_env("prolog", PROLOG_ENV)
    assert (ctx.job_id, ctx.node, ctx.user, ctx.uid, ctx.gid) == ("17", "n2", "alice", 1001, 1001)
    assert ctx.nodes == ["n1", "n2"]
    assert ctx.gpus == [0, 1]
    assert ctx.attempt == 2
    assert ctx.stdout == "job-%j.out"
    assert not ctx.first_node
    assert ctx.exit_code is None


def test_epilog_context_has_the_exit() -> None:
    env = {**PROLOG_ENV, "SLURM_JOB_EXIT_CODE": "768", "SLURM_JOB_EXIT_CODE2": "3:0",
           "SLURM_SCRIPT_CONTEXT": "epilog_slurmd", "SLURMD_NODENAME": "n1"}
    ctx = from_env("epilog", env)
    assert (ctx.exit_code, ctx.exit_signal) == (3, 0)
    assert ctx.first_node


def test_task_prolog_reads_the_jobs_own_environment() -> None:
    env = {"SLURM_JOB_ID": "17", "SLURMD_NODENAME": "n1", "USER": "alice",
           "SLURM_JOB_NODELIST": "n1", "SLURM_RESTART_COUNT": "1", "SLURM_JOB_GPUS": "2,3"}
    ctx = from_env("task-prolog", env)
    assert (ctx.user, ctx.attempt, ctx.gpus) == ("alice", 1, [2, 3])


def test_no_slurm_environment_is_a_clear_error() -> None:
    with pytest.raises(NotUnderSlurm, match="must be run by Slurm: SLURM_JOB_ID is not set"):
        from_env("prolog", {})


@pytest.mark.parametrize("job_id", ["../../etc", "12;rm", "1 2"])
def test_hostile_job_id(job_id: str) -> None:
    with pytest.raises(NotUnderSlurm, match="is not a Slurm job id"):
        from_env("prolog", {**PROLOG_ENV, "SLURM_JOB_ID": job_id})


def test_missing_node_name() -> None:
    env = dict(PROLOG_ENV)
    del env["SLURMD_NODENAME"]
    with pytest.raises(NotUnderSlurm, match="SLURMD_NODENAME"):
        from_env("prolog", env)
