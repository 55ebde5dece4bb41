"""Jobs that fail come back from their latest valid checkpoint; jobs that cannot, stop.

A real 1-node job runs the toy training loop as the test user, is made to fail in one
way, and must end with exactly the sum of an uninterrupted run.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import jobwrap_dev.sandbox
from jobwrap_dev.sandbox.cluster import Cluster

STEPS = 8
EXPECTED = STEPS * (STEPS + 1) // 2
PAYLOAD = Path(jobwrap_dev.sandbox.__file__).parent / "toy_train.py"


def job_script(name: str, how: str, crash_at: int, *, extra: str = "", steps: int = STEPS,
               run_wrapper: str = "") -> str:
    return f"""#!/bin/bash
#SBATCH --output={name}-%j.out
#SBATCH --open-mode=append
#JOBWRAP --checkpoint-dir=ckpt-{name} --max-restarts=3 {extra}
export CRASH_AT={crash_at} CRASH_HOW={how}
{run_wrapper}python3 train.py {steps} 0.4
"""


@pytest.fixture(scope="module")
def payload(cluster: Cluster) -> str:
    path = cluster.write_user_file("train.py", PAYLOAD.read_text())
    return str(path)


def run_job(cluster: Cluster, name: str, script: str, *, timeout: float = 150) -> tuple[str,
                                                                                       str]:
    shutil.rmtree(cluster.work / f"ckpt-{name}", ignore_errors=True)
    job_id = cluster.submit(script, name=f"{name}.sh")
    info = cluster.wait_job(job_id, timeout=timeout,
                            states={"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"})
    # a requeued job passes through PENDING again: wait for its final attempt
    output = (cluster.work / f"{name}-{job_id}.out").read_text()
    return job_id, output + f"\n[final state {info['JobState']} restarts {info['Restarts']}]"


def attempt_ends(cluster: Cluster, job_id: str) -> list[dict[str, object]]:
    return [e for e in cluster.events(job_id)
            if e["event"] == "attempt.end" and e["source"] == "root"]


# A SIGKILL with no OOM kill recorded came from outside the job's code: ``killed``.
@pytest.mark.parametrize(("how", "kind"), [("exit", "user_error"), ("kill", "killed"),
                                           ("truncate", "user_error")])
def test_crash_resumes_from_latest_valid_checkpoint(cluster: Cluster, payload: str, how: str,
                                                    kind: str) -> None:
    job_id, output = run_job(cluster, f"crash-{how}", job_script(f"crash-{how}", how, 4))
    assert f"done sum {EXPECTED}" in output, output
    assert "[final state COMPLETED restarts 1]" in output, output
    ends = attempt_ends(cluster, job_id)
    assert [(e["attempt"], e["kind"], e["decision"]) for e in ends] == [
        (0, kind, "requeue"), (1, "success", "done")], ends
    resumed = 3 if how == "truncate" else 4  # a truncated newest checkpoint is skipped
    assert "attempt=1 resume=" in output and f"start={resumed}" in output, output
    assert "jobwrap: attempt 0 ended" in output  # the user is told, in their own output


def test_hang_is_caught_and_resumed(cluster: Cluster, payload: str) -> None:
    job_id, output = run_job(cluster, "hang",
                             job_script("hang", "hang", 3, extra="--hang-timeout=8s"))
    assert f"done sum {EXPECTED}" in output, output
    kinds = [(e["kind"], e["decision"]) for e in attempt_ends(cluster, job_id)]
    assert kinds == [("hang", "requeue"), ("success", "done")], kinds
    events = [e["event"] for e in cluster.events(job_id)]
    assert "hang" in events and "checkpoint" in events


def test_the_same_error_every_time_stops(cluster: Cluster, payload: str) -> None:
    job_id, output = run_job(cluster, "loop", job_script("loop", "always", 2))
    ends = attempt_ends(cluster, job_id)
    assert [e["decision"] for e in ends] == ["requeue", "stop"], ends
    assert "the same error ended attempts 0 and 1" in str(ends[-1]["reason"])
    assert "Not requeued: the same error ended attempts 0 and 1" in output
    assert "[final state FAILED restarts 1]" in output


def test_success_is_never_requeued(cluster: Cluster, payload: str) -> None:
    job_id, output = run_job(cluster, "ok", job_script("ok", "exit", 0, steps=3))
    assert "done sum 6" in output
    ends = attempt_ends(cluster, job_id)
    assert [(e["kind"], e["decision"]) for e in ends] == [("success", "done")]
    assert "[final state COMPLETED restarts 0]" in output


def test_jobwrap_run_recovers_in_place(cluster: Cluster, payload: str) -> None:
    jobwrap = cluster.runtime / "venv" / "bin" / "jobwrap"
    _job_id, output = run_job(cluster, "inplace", job_script(
        "inplace", "kill", 3, run_wrapper=f"{jobwrap} run --checkpoint-dir=ckpt-inplace "
        "--max-restarts=2 -- "))
    assert f"done sum {EXPECTED}" in output, output
    assert "jobwrap run: attempt 1: resuming from" in output
    assert "[final state COMPLETED restarts 0]" in output  # no Slurm requeue was needed


def test_supervisor_killed_mid_job_does_not_lose_recovery(cluster: Cluster,
                                                          payload: str) -> None:
    script = job_script("nosup", "exit", 5).replace(
        "python3 train.py", "pkill -KILL -u $USER -f 'wrapper supervise' || true\npython3 train.py")
    job_id, output = run_job(cluster, "nosup", script)
    assert f"done sum {EXPECTED}" in output, output
    kinds = [(e["kind"], e["decision"]) for e in attempt_ends(cluster, job_id)]
    assert kinds == [("user_error", "requeue"), ("success", "done")]


def test_gpu_xid_mid_run_drains_the_node_and_resumes_on_the_other(cluster: Cluster,
                                                                  payload: str) -> None:
    import time

    from wrapper.runner import Runner

    name = "xid"
    shutil.rmtree(cluster.work / f"ckpt-{name}", ignore_errors=True)
    script = job_script(name, "none", 0, steps=12).replace(
        "#SBATCH --open-mode=append", "#SBATCH --open-mode=append\n#SBATCH --gres=gpu:1")
    job_id = cluster.submit(script, name=f"{name}.sh")
    out = cluster.work / f"{name}-{job_id}.out"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "step 3 " not in (out.read_text() if out.exists()
                                                           else ""):
        time.sleep(0.2)
    first = next(e for e in cluster.events(job_id)
                 if e["event"] == "prolog.context")
    node, gpus = first["node"], first["context"]["gpus"]
    other = "n2" if node == "n1" else "n1"
    try:
        cluster.set_gpu_faults(node, {g: {"xid_events": (79,)} for g in gpus})
        info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED"}, timeout=120)
        output = out.read_text()
        assert info["JobState"] == "COMPLETED", output
        assert f"done sum {12 * 13 // 2}" in output, output
        ends = attempt_ends(cluster, job_id)
        assert [(e["kind"], e["decision"], e["node"]) for e in ends] == [
            ("hardware", "requeue", node), ("success", "done", other)], ends
        assert ends[0]["exclude"] == [node]
        faults = [e for e in cluster.events(job_id)
                  if e["event"] == "gpu.fault"]
        assert faults and "79" in faults[0]["reason"]
        state = Runner(cluster.env()).run(["sinfo", "-h", "-N", "-n", node, "-o", "%T|%E"],
                                          timeout=10).stdout.strip()
        assert state.startswith("drain") and "|jobwrap: xid gpu" in state, state
    finally:
        cluster.set_gpu_faults(node)
        Runner(cluster.env()).run(["scontrol", "update", f"NodeName={node}", "State=RESUME"],
                                  timeout=20, check=False)
        cluster.wait_idle(timeout=30)


def test_a_checkpoint_that_crashes_the_resume_falls_back_to_the_one_before(
        cluster: Cluster, payload: str) -> None:
    job_id, output = run_job(cluster, "poison", job_script("poison", "poison", 4))
    assert f"done sum {EXPECTED}" in output, output
    assert "[final state COMPLETED restarts 2]" in output, output
    ends = attempt_ends(cluster, job_id)
    # Attempt 1 made no progress (as attempt 0): without the fallback the job would stop.
    assert [(e["attempt"], e["kind"], e["decision"]) for e in ends] == [
        (0, "user_error", "requeue"), (1, "user_error", "requeue"), (2, "success", "done")], ends
    events = cluster.events(job_id)
    poisoned = str(cluster.work / "ckpt-poison" / "epoch=0-step=4.ckpt")
    suspects = [e for e in events if e["event"] == "checkpoint.suspect"]
    assert [(e["source"], e["attempt"], e["path"]) for e in suspects] == [
        ("root", 1, poisoned)], suspects
    chosen = [(e["attempt"], Path(str(e["path"])).name) for e in events
              if e["event"] == "resume.chosen" and e["source"] == "root"]
    assert chosen == [(1, "epoch=0-step=4.ckpt"), (2, "epoch=0-step=3.ckpt")], chosen
    assert "attempt=2 resume=" in output and "start=3" in output, output
    assert f"falling back past the suspect checkpoint {poisoned}" in output, output
    status = subprocess.run([str(cluster.runtime / "venv" / "bin" / "jobwrap"), "--config",
                             str(cluster.jobwrap_config), "status", job_id],
                            capture_output=True, text=True, env=cluster.env(), timeout=60,
                            check=False)
    assert f"checkpoint {poisoned} is suspect" in status.stdout, status
