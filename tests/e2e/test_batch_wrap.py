"""In-allocation restarts with no change to the script ([restart] batch_wrapper): the site
sets the path of jobwrap on its nodes, job_submit.lua adds its line to a plain batch
script, and a rank SIGKILLed mid-run restarts inside the allocation under jobwrap run,
from the latest checkpoint: the same job, never requeued, every step done once. The
archive keeps the script as its user wrote it.
"""

from __future__ import annotations

import gzip
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

import jobwrap_dev.sandbox
from jobwrap_dev.sandbox.cluster import Cluster
from wrapper import config
from wrapper.restart.batch import MARK
from wrapper.runner import Runner
from wrapper.slurm.parse import expand_hostlist
from wrapper.submit.lua import SiteDefaults, install, render

STEPS = 14
EXPECTED = STEPS * (STEPS + 1) // 2
PAYLOAD = Path(jobwrap_dev.sandbox.__file__).parent / "toy_train.py"
# rank 0 keeps the checkpoints jobwrap resumes from; rank 1 trains beside it in lockstep
RANK = ('echo "rank $SLURM_PROCID on $SLURMD_NODENAME"; D=$JOBWRAP_CHECKPOINT_DIR; '
        'if [ "$SLURM_PROCID" = 0 ]; then export TOY_PEER_DIR=$D-r1; else '
        'export TOY_PEER_DIR=$D JOBWRAP_CHECKPOINT_DIR=$D-r1; mkdir -p $D-r1; fi; '
        f'exec python3 train.py {STEPS} 0.4')
SCRIPT = f"""#!/bin/bash
#SBATCH --output=wrap-%j.out -N2 --ntasks-per-node=1
#JOBWRAP --checkpoint-dir=ckpt-wrap --max-restarts=2

echo "script starts: attempt $JOBWRAP_ATTEMPT"
srun bash -c '{RANK}'
"""


@pytest.fixture
def wrapping(cluster: Cluster) -> Iterator[None]:
    """The site's job_submit.lua with ``batch_wrapper`` set, for this test only."""
    etc = cluster.conf.parent
    site = SiteDefaults.from_config(config.load(str(cluster.jobwrap_config)))
    jobwrap = str(cluster.runtime / "venv" / "bin" / "jobwrap")
    install(etc, render(replace(site, batch_wrapper=jobwrap)))
    try:
        yield
    finally:
        install(etc, render(site, str(cluster.jobwrap_config)))


def _rank_1(job_id: str) -> psutil.Process:
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            if "train.py" not in " ".join(proc.info["cmdline"] or []) or \
                    not (proc.info["name"] or "").startswith("python"):
                continue
            env = proc.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if env.get("SLURM_JOB_ID") == job_id and env.get("SLURM_PROCID") == "1":
            return proc
    raise AssertionError(f"no rank 1 of job {job_id}")


def test_a_plain_script_restarts_a_killed_rank_inside_its_allocation(
        cluster: Cluster, wrapping: None) -> None:
    cluster.write_user_file("train.py", PAYLOAD.read_text())
    for folder in ("ckpt-wrap", "ckpt-wrap-r1"):
        shutil.rmtree(cluster.work / folder, ignore_errors=True)
    job_id = cluster.submit(SCRIPT, name="wrap.sh")
    out = cluster.work / f"wrap-{job_id}.out"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and "step 4 " not in (out.read_text() if out.exists()
                                                            else ""):
        time.sleep(0.2)
    assert "step 4 " in out.read_text(), out.read_text()
    _rank_1(job_id).send_signal(signal.SIGKILL)
    info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED", "CANCELLED"}, timeout=150)
    output = out.read_text()
    assert info["JobState"] == "COMPLETED", output
    assert info["Restarts"] == "0", output  # never requeued: it kept its allocation
    assert f"done sum {EXPECTED}" in output, output  # no step lost or done twice
    assert "jobwrap run: attempt 1: resuming from" in output, output
    assert output.count("script starts") == 2, output  # the whole script, again
    events = cluster.events(job_id)
    # one prolog on each of its two nodes (whichever were idle), none again
    assert sorted(e["node"] for e in events if e["event"] == "prolog.context") == \
        sorted(expand_hostlist(info["NodeList"])), (info["NodeList"], events)
    # rank 0 failed at once with gloo's words (its peer's link closed), not by the hang
    # floor: jobwrap run names the cause, the rank killed from outside
    assert "Connection closed by peer" in output, output
    assert [(e["restart"], e["kind_ended"]) for e in events
            if e["event"] == "run.restarted"] == [(1, "killed")], events
    ends = [(e["kind"], e["decision"]) for e in events
            if e["event"] == "attempt.end" and e["source"] == "root"]
    assert ends == [("success", "done")], ends
    # Slurm keeps the script with the line in; the archive, as its user wrote it
    kept = Runner(cluster.env()).run(["scontrol", "write", "batch_script", job_id, "-"],
                                     timeout=20).stdout
    assert MARK in kept and kept.count("\n") == SCRIPT.count("\n") + 1, kept
    host = info["BatchHost"]
    archived = cluster.base / "jobwrap" / "archive" / cluster.spec.user / job_id / \
        "attempt-0" / host / "batch-script.sh.gz"
    assert gzip.decompress(archived.read_bytes()).decode() == SCRIPT
