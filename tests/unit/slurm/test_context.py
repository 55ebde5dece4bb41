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


# What Slurm 25.11 adds to the prolog's environment (prep_script_slurmd.c, seen running).
ENV_25 = {**PROLOG_ENV, "SLURM_JOB_START_TIME": "1700000000",
          "SLURM_JOB_END_TIME": str(1700000000 + 90 * 60), "SLURM_JOB_STDERR": "/logs/%u-%4j.err"}


def test_slurm_25_environment_answers_what_the_prolog_asked_slurmctld() -> None:
    from datetime import datetime

    from wrapper.slurm.context import known_info
    from wrapper.slurm.records import slurm_timestamp, time_limit_seconds

    info = known_info(from_env("prolog", ENV_25))
    assert info is not None
    assert info["StdOut"] == "/home/alice/job-17.out"
    assert info["StdErr"] == "/logs/alice-0017.err"
    assert info["WorkDir"] == "/home/alice"
    assert time_limit_seconds(info["TimeLimit"]) == 90 * 60
    assert slurm_timestamp(info["StartTime"]) == 1700000000
    assert datetime.fromisoformat(info["StartTime"])


@pytest.mark.parametrize("change", [
    {"SLURM_JOB_START_TIME": ""},  # Slurm 22.05: none of these
    {"SLURM_JOB_STDOUT": "out-%x.log"},  # the job's name: only slurmctld knows it
    {"SLURM_JOB_STDERR": "%A_%a.err"},  # array ids
])
def test_what_the_environment_cannot_say_is_asked(change: dict[str, str]) -> None:
    from wrapper.slurm.context import known_info

    assert known_info(from_env("prolog", {**ENV_25, **change})) is None


def test_unlimited_job_and_escaped_pattern() -> None:
    from wrapper.slurm.context import known_info

    info = known_info(from_env("prolog", {**ENV_25, "SLURM_JOB_END_TIME": str(
        1700000000 + 366 * 86400), "SLURM_JOB_STDOUT": "raw\\%j.out"}))
    assert info is not None and info["TimeLimit"] == "UNLIMITED"
    assert info["StdOut"] == "/home/alice/raw%j.out"


@pytest.mark.parametrize("extra", ["", "rack=7", "jobwrap:10 x", "jobwrap:1x"])
def test_extra_not_written_by_jobwrap_is_no_script(extra: str) -> None:
    from wrapper.slurm.context import known_script

    assert known_script(from_env("prolog", {**PROLOG_ENV, "SLURM_JOB_EXTRA": extra})) is None


def test_a_rewritten_extra_is_user_input_checked_like_a_script() -> None:
    """scontrol update Extra=... is the user's: the prolog's parse of it is the script's."""
    from wrapper.errors import UserInputError
    from wrapper.job.record import _build
    from wrapper.slurm.context import known_script
    from wrapper.submit.directives import parse_script

    ctx = from_env("prolog", {**PROLOG_ENV, "SLURM_JOB_EXTRA":
                              "jobwrap:1 #JOBWRAP --max-restarts=100000%0A#JOBWRAP --x"})
    script = known_script(ctx)
    assert script == "#JOBWRAP --max-restarts=100000\n#JOBWRAP --x"
    with pytest.raises(UserInputError):
        parse_script(script)
    record = _build(ctx, {"WorkDir": "/home/alice"}, script)
    assert record.options_error and record.options == _build(ctx, {}, "").options
