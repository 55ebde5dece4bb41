"""Whichever Slurm the tier runs on (JOBWRAP_SLURM_PREFIX: a built one, 25.11 in CI, 23.11
or 24.11 by tools/compat; unset: Debian's 22.05): the backend it gets, and slurmctld's
calls per job start, counted by sdiag."""

from __future__ import annotations

import subprocess
import sys
import time
from importlib import metadata

import pytest

from jobwrap_dev.sandbox import flavor
from jobwrap_dev.sandbox.cluster import Cluster
from wrapper import slurm
from wrapper.config import SlurmConfig
from wrapper.runner import Runner


def _config(cluster: Cluster, backend: str = "auto") -> SlurmConfig:
    prefix = cluster.spec.slurm_prefix
    return SlurmConfig(backend=backend, command_timeout=20,
                       scontrol_command=flavor.program(prefix, "scontrol"),
                       squeue_command=flavor.program(prefix, "squeue"))


def _rpcs(cluster: Cluster) -> dict[str, int]:
    res = Runner(cluster.env()).run(["sdiag"], timeout=20)
    return flavor.rpc_counts(res.stdout)


def _pyslurm() -> str:
    """The pyslurm installed beside these tests ("" none), read without importing it."""
    try:
        return metadata.version("pyslurm")
    except metadata.PackageNotFoundError:
        return ""


def test_backend_is_pyslurm_exactly_where_it_matches(cluster: Cluster,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    chosen = slurm.backend(_config(cluster), Runner(cluster.env()))
    running = slurm.backend(_config(cluster, "cli"), Runner(cluster.env())).version()
    # .venv-slurm25 on 25.11: tools/bootstrap-slurm25 built pyslurm for it. Debian's 22.05,
    # 23.11 and 24.11 (tools/compat): no pyslurm release on PyPI builds against them, and
    # pyslurm 25.11 beside them must not be taken.
    matches = _pyslurm().split(".")[:2] == running.split(".")[:2]
    assert chosen.name == ("pyslurm" if matches else "cli"), (_pyslurm(), running)


def test_pyslurm_reads_what_scontrol_reads(cluster: Cluster,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    auto = slurm.backend(_config(cluster), Runner(cluster.env()))
    cli = slurm.backend(_config(cluster, "cli"), Runner(cluster.env()))
    script = "#!/bin/bash\n#SBATCH --output=rd-%j.out\n#JOBWRAP --max-restarts=1\necho hi\n"
    job = cluster.submit(script, "--time=7", name="rd.sh")
    cluster.wait_job(job, timeout=60)
    theirs, ours = auto.job_info(job), cli.job_info(job)
    for key in ("JobId", "JobState", "WorkDir", "StdOut", "TimeLimit", "Partition", "NodeList",
                "Requeue", "UserId"):
        assert theirs[key] == ours[key], key
    assert auto.batch_script(job) == cli.batch_script(job) == script
    assert "IDLE" in auto.node_info("n1")["State"].upper()


@pytest.mark.parametrize("output", ["#SBATCH --output=cnt-%j.out\n", ""],
                         ids=["output", "no-output"])
def test_job_start_costs_slurmctld_at_most_two_calls(cluster: Cluster, output: str) -> None:
    """A 2-node job with directives: the prologs on both nodes and the supervisor's first
    look. 25.11 hands the prolog the job (SLURM_JOB_*, job_submit.lua's Extra): no call
    per node, with or without --output (slurmctld gives a batch job with none its default
    slurm-%j.out, which the prolog's SLURM_JOB_STDOUT carries). 23.11 and 24.11 hand it
    too, but no SLURM_JOB_STDOUT for a job without --output (slurmctld leaves the default
    to slurmstepd): then the job record per node, never the script (docs/compat.md).
    22.05 does not: the job record and the script, per node."""
    script = (f"#!/bin/bash\n{output}#JOBWRAP --checkpoint-dir=ck "
              "--max-restarts=1\necho started > started-$SLURM_JOB_ID\nsleep 15\n")
    warm = cluster.submit(script, "-N", "2", name="cnt.sh")  # fills the nodes' gres caches
    cluster.wait_job(warm, timeout=90)
    before = _rpcs(cluster)
    job = cluster.submit(script, "-N", "2", name="cnt.sh")
    marker = cluster.work / f"started-{job}"
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # no Slurm query of the test's own between the two counts
    assert marker.exists(), f"job {job} did not start"
    time.sleep(3)  # the supervisor's first look
    calls = flavor.rpc_delta(before, _rpcs(cluster))
    Runner(cluster.env()).run(["scancel", job], timeout=20)
    total = sum(calls.values())
    running = flavor.version(cluster.spec.slurm_prefix)
    if running >= (25, 11) or (running >= (23, 2) and output):
        assert total <= 2, calls
    elif running >= (23, 2):
        assert total <= 2 + 2 and "REQUEST_BATCH_SCRIPT" not in calls, calls
    else:
        assert total <= 2 * 2 + 1, calls  # 22.05: job record + script per node, supervisor


def test_pyslurm_is_not_imported_without_a_readable_slurm_conf(cluster: Cluster) -> None:
    """libslurm reads slurm.conf as pyslurm imports and, where it cannot, retries for a
    minute then exits the process: a hook would die (and its node drain). The backend
    then is the CLI one, at once, and the process lives on."""
    code = ("from wrapper import slurm; from wrapper.config import SlurmConfig; "
            "from wrapper.runner import Runner; "
            f"print(slurm.backend(SlurmConfig(scontrol_command={_config(cluster).scontrol_command!r}"
            "), Runner()).name)")
    for conf in ("/nonexistent/slurm.conf", ""):
        env = {**cluster.env(), "SLURM_CONF": conf}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=30, check=False)
        assert (done.returncode, done.stdout.split()[-1:]) == (0, ["cli"]), done.stderr
        if _pyslurm():  # pyslurm is there: one line says why it is not used
            assert "names no readable slurm.conf; using Slurm's commands" in done.stdout
