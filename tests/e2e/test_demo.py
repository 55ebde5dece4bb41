"""The demo (``python -m jobwrap_dev sandbox demo``) end to end on the real cluster: each
part shows what it claims.

The demo runs here on the session's shared cluster (the demo command adds only
bringing a cluster up and down, which every e2e session does through the same class),
so a change that breaks any of its six parts fails this test instead of a new admin's
first run.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import psutil

from jobwrap_dev.sandbox import demo
from jobwrap_dev.sandbox.cluster import Cluster
from jobwrap_dev.sandbox.demo import PARTS, run_demo
from tests.support import framework_python


def uninterrupted_weights(tmp_path: Path) -> str:
    """The final weights' hash of the demo's Lightning job run straight through, here."""
    env = {**os.environ, "JOBWRAP_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
           "PYTHONWARNINGS": "ignore"}
    env.pop("JOBWRAP_RESUME_FROM", None)
    env.pop("KILL_AT", None)
    done = subprocess.run([framework_python(), str(Path(demo.__file__).parent /
                                                   "lightning_train.py"), "8"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                          check=True)
    found = re.search(r"^done epochs=8 weights=(\w+)$", done.stdout, re.M)
    assert found, done.stdout + done.stderr
    return found.group(1)


def test_the_demo_tells_each_part(cluster: Cluster, tmp_path: Path) -> None:
    cluster.wait_idle(timeout=60)
    lines: list[str] = []
    shown = run_demo(cluster, lines.append)
    text = "\n".join(lines)
    headers = [line for line in lines if line.startswith("\n=== part ")]
    assert [h.split()[2] for h in headers] == [f"{n}/{PARTS}:" for n in range(1, PARTS + 1)]

    # 1. the faulty GPU's node drained with jobwrap's reason; the job ran on the other
    bad = shown["bad_gpu"]
    assert bad["state"].startswith("drain"), bad
    assert bad["reason"].startswith("jobwrap: row_remap gpu0(GPU-"), bad
    assert bad["job_state"] == "COMPLETED" and bad["ran_on"] == "n2", bad
    assert bad["held"] is False
    assert "failed its health check" in bad["output"] and "ran on n2" in bad["output"]
    assert set(cluster.node_states().values()) == {"idle"}  # the demo put n1 back

    # 2. staged in once from the user's tree, the second time from the node's cache
    first, second = shown["staging"]["runs"]
    assert first["files"] == second["files"] == 201, shown["staging"]
    assert first["cache_hits"] == 0 and second["cache_hits"] >= 1, shown["staging"]

    # 3. a real Lightning job killed as epoch 4 starts, resumed from epoch 3's checkpoint
    # (step=4), ending with the weights of an uninterrupted run
    train = shown["resume"]
    assert train["job_state"] == "COMPLETED", train
    out = train["output"]
    assert "attempt 0: SIGKILL at the start of epoch 4" in out, out
    assert "attempt=1 resume_from=" in out and "epoch=3-step=4.ckpt" in out, out
    assert "attempt=1 epoch=4 " in out and "attempt=1 epoch=3 " not in out, out
    assert out.rstrip().endswith(f"done epochs=8 weights={uninterrupted_weights(tmp_path)}"), out
    assert "2 attempts" in train["status"] and "decision     requeue" in train["status"]
    # the requeue says what `jobwrap run` would have kept; with it, the same kill is
    # restarted inside the allocation: no requeue, the same weights
    assert "`jobwrap run -- CMD`" in out, out
    inplace = train["inplace"]
    assert (inplace["job_state"], inplace["restarts"]) == ("COMPLETED", "0"), inplace
    assert "jobwrap run: attempt 0 ended: killed" in inplace["output"], inplace["output"]
    # jobwrap run took the checkpoint folder from the job's #JOBWRAP line
    assert "jobwrap run: attempt 1: resuming from" in inplace["output"], inplace["output"]
    assert "attempt=1 resume_from=" in inplace["output"] and \
        "epoch=3-step=4.ckpt" in inplace["output"], inplace["output"]
    assert "attempt=1 epoch=4 " in inplace["output"], inplace["output"]
    assert "attempt=1 epoch=3 " not in inplace["output"], inplace["output"]
    # the run's last words are the done line; Lightning's own stderr note may land after it
    # (stdout and stderr reach the output file on their own)
    done = [line for line in inplace["output"].splitlines() if line.startswith("done ")]
    assert done == [f"done epochs=8 weights={uninterrupted_weights(tmp_path)}"], \
        inplace["output"]
    after = inplace["output"].split(done[0], 1)[1]
    assert "epoch=" not in after and "attempt=" not in after, inplace["output"]

    # 4. the archive lists the job and shows its manifest
    job = train["job"]
    assert any(line.split()[:1] == [job] for line in shown["archive"]["list"].splitlines())
    assert f"job {job} (demo-train)" in shown["archive"]["show"]
    assert "archive complete" in shown["archive"]["show"]

    # 5. the guard's dry run names the user's torchrun, and the demo stopped it
    guard = shown["login_guard"]
    assert guard["returncode"] == 0
    assert f"  {cluster.spec.user} ai: " in guard["report"] and "torchrun" in guard["report"]
    # the pids it may act on: the user's torchrun among them (any other AI work the user
    # runs on this host is listed too)
    acting = [line.split(":", 1)[1] for line in guard["report"].splitlines()
              if line.strip().startswith("may act on:")]
    assert any(str(guard["pid"]) in [p.strip() for p in pids.split(",")] for pids in acting), \
        guard["report"]
    assert not psutil.pid_exists(int(guard["pid"])) or \
        psutil.Process(int(guard["pid"])).status() == psutil.STATUS_ZOMBIE

    # 6. doctor passes on the sandbox
    assert shown["doctor"]["returncode"] == 0, shown["doctor"]["report"]
    assert " 0 failed" in shown["doctor"]["report"]
    assert "Traceback" not in text
