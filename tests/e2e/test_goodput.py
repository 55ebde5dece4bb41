"""Goodput on a real cluster with Slurm accounting (slurmdbd + MariaDB, private, on
loopback): a job that fails once and resumes has its ledger in ``jobwrap status``, its
outcome in sacct's AdminComment, its share in the metrics and its failure in
``jobwrap report``."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import jobwrap_dev.sandbox
from jobwrap_dev.sandbox.cluster import Cluster
from jobwrap_dev.sandbox.daemons import alive
from tests.sandbox import free_ports, make_spec
from wrapper.runner import Runner

PAYLOAD = Path(jobwrap_dev.sandbox.__file__).parent / "toy_train.py"
STEPS = 8


@pytest.fixture(scope="module")
def accounted() -> Iterator[Cluster]:
    spec = make_spec("jobwrap-goodput-")
    spec.accounting = True
    spec.db_port, spec.dbd_port = free_ports(2)
    cluster = Cluster(spec)
    cluster.up(log=lambda msg: None)
    yield cluster
    daemons = list(cluster.daemons)
    cluster.down()
    left = [d.name for d in daemons if alive(d)]
    assert not left, f"the harness left daemons running: {left}"
    shutil.rmtree(spec.base, ignore_errors=True)  # MariaDB's files: 200 MB a run


def _jobwrap(cluster: Cluster, *args: str) -> str:
    env = {**cluster.env(), "JOBWRAP_CONFIG": str(cluster.jobwrap_config)}
    return Runner(env).run([str(cluster.runtime / "venv" / "bin" / "jobwrap"), *args],
                           timeout=60).stdout


def test_a_failed_and_resumed_job_is_accounted_everywhere(accounted: Cluster) -> None:
    cluster = accounted
    cluster.write_user_file("train.py", PAYLOAD.read_text())
    said = cluster.base / "notified.txt"  # the site's command, run by root's epilog
    with cluster.jobwrap_config.open("a") as config:
        config.write(f'\n[notify]\ncommand = ["/bin/sh", "-c", "cat >> {said}; '
                     f'echo \\"[$0 $1]\\" >> {said}", "{{event}}", "{{job_id}}"]\n')
    shutil.rmtree(cluster.work / "ckpt-gp", ignore_errors=True)
    job_id = cluster.submit(f"""#!/bin/bash
#SBATCH --output=gp-%j.out
#SBATCH --open-mode=append
#JOBWRAP --checkpoint-dir=ckpt-gp --max-restarts=3
export CRASH_AT=4 CRASH_HOW=exit
python3 train.py {STEPS} 0.4
""", name="gp.sh")
    info = cluster.wait_job(job_id, timeout=180, states={"COMPLETED", "FAILED", "CANCELLED"})
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", info

    # the site was told of the requeue, detached from the epilog
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not said.exists():
        time.sleep(0.5)
    told = said.read_text() if said.exists() else ""
    assert f"jobwrap: job {job_id} (attempt 0, user {cluster.spec.user}) requeued after " \
           f"user_error" in told and f"[requeue {job_id}]" in told, told

    # sacct: the outcome of each attempt, from Slurm's own database
    comment = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = Runner(cluster.env()).run(["sacct", "-j", job_id, "-n", "-P", "-X",
                                          "-o", "AdminComment"], timeout=30, check=False)
        out = done.stdout if done.returncode == 0 else ""
        comment = out.strip().splitlines()[-1] if out.strip() else ""
        if "a1=" in comment:
            break
        time.sleep(1)
    assert comment.startswith("jobwrap: a0=user_error/requeue a1=success/done ettr="), \
        (comment, done.stderr)
    assert 0 < float(comment.rsplit("ettr=", 1)[1]) <= 1

    # jobwrap status: the ledger
    status = json.loads(_jobwrap(cluster, "status", job_id, "--json"))
    ledger = status["goodput"]
    assert ledger["failures"] == 1 and 0 < ledger["ettr"] <= 1, ledger
    assert [a["kind"] for a in ledger["attempts"]] == ["user_error", "success"]
    assert ledger["gaps_by_class"]["user_error"][0] > 0
    assert "goodput  ETTR" in _jobwrap(cluster, "status", job_id)

    # the metrics: this job's share
    prom = "".join(cluster.metrics_texts())
    assert 'jobwrap_restart_gaps_total{class="user_error"' in prom, prom
    assert "jobwrap_goodput_wall_seconds_total" in prom

    # jobwrap report over the archive
    report = json.loads(_jobwrap(cluster, "report", "--json"))["report"]
    assert report["jobs"] >= 1 and report["failures_by_class"].get("user_error") == 1, report
    assert report["restart_gaps"] == 1 and report["mtbf_s"] > 0
    assert set(report["nodes"]) <= {"n1", "n2"} and report["nodes"]
