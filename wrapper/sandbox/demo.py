"""``jobwrap sandbox demo``: run a 2-node GPU job as the test user and show what each hook saw."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from wrapper.sandbox.cluster import Cluster
from wrapper.state import JobState

DEMO_JOB = """#!/bin/bash
#SBATCH --job-name=jobwrap-demo
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:2
#SBATCH --output=demo-%j.out
srun bash -c 'echo "task on $SLURMD_NODENAME: JOBWRAP_ATTEMPT=$JOBWRAP_ATTEMPT \\
JOBWRAP_SCRATCH=$JOBWRAP_SCRATCH CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"'
"""


TRAIN_JOB = """#!/bin/bash
#SBATCH --job-name=jobwrap-resume-demo
#SBATCH --gres=gpu:1
#SBATCH --output=train-%j.out
#SBATCH --open-mode=append
#JOBWRAP --checkpoint-dir=ckpt-demo --max-restarts=2
# a toy training loop: 8 steps, a checkpoint per step; the first attempt is killed at step 4
CRASH_AT=4 CRASH_HOW=kill python3 toy_train.py 8 0.3
"""


def run_demo(cluster: Cluster, echo: Callable[[str], None] = print) -> str:
    """The two parts of the demo: what each hook saw, then a crash that heals."""
    job_id = run_hooks_demo(cluster, echo)
    run_resume_demo(cluster, echo)
    return job_id


def run_resume_demo(cluster: Cluster, echo: Callable[[str], None] = print) -> str:
    """A toy training job is killed mid-run and comes back from its latest checkpoint."""
    import shutil

    shutil.rmtree(cluster.work / "ckpt-demo", ignore_errors=True)
    cluster.write_user_file("toy_train.py", (Path(__file__).parent / "toy_train.py").read_text())
    job_id = cluster.submit(TRAIN_JOB, name="train.sh")
    echo(f"\n=== a training job that crashes: job {job_id} (killed with SIGKILL at step 4)")
    info = cluster.wait_job(job_id, timeout=180)
    echo(f"job {job_id} {info.get('JobState')} after {info.get('Restarts')} requeue(s)")
    echo(f"\n--- the job's output ({cluster.work / f'train-{job_id}.out'})")
    echo((cluster.work / f"train-{job_id}.out").read_text().rstrip())
    echo("\n--- what jobwrap decided (per-job state)")
    for event in JobState(cluster.state_dir, job_id).events():
        if event.get("event") == "attempt.end":
            echo(f"attempt {event.get('attempt')} on {event.get('node')}: {event.get('kind')} "
                 f"-> {event.get('decision')}: {event.get('reason')}")
    return job_id


def run_hooks_demo(cluster: Cluster, echo: Callable[[str], None] = print) -> str:
    """Submit the demo job, wait for it, print the job's output and the hooks' records."""
    job_id = cluster.submit(DEMO_JOB, name="demo.sh")
    echo(f"submitted job {job_id} as {cluster.spec.user}: 2 nodes, 2 GPUs each")
    info = cluster.wait_job(job_id, timeout=120)
    echo(f"job {job_id} {info.get('JobState')} (exit {info.get('ExitCode')}) "
         f"on {info.get('NodeList')}")
    output = cluster.work / f"demo-{job_id}.out"
    echo(f"\n--- the job's output ({output})")
    echo(output.read_text().rstrip() if output.exists() else "(no output file)")
    echo(f"\n--- what each hook saw (per-job state: {cluster.state_dir}/jobs/{job_id}/)")
    echo(f"{'hook':<12} {'node':<5} {'writer':<6} {'user':<8} {'gpus':<6} attempt")
    for event in JobState(cluster.state_dir, job_id).events():
        if not str(event.get("event", "")).endswith(".context"):
            continue
        ctx = event.get("context", {})
        echo(f"{ctx.get('hook', '?'):<12} {ctx.get('node', '?'):<5} {event['source']:<6} "
             f"{ctx.get('user', '?'):<8} {','.join(map(str, ctx.get('gpus', []))) or '-':<6} "
             f"{ctx.get('attempt', '?')}")
    return job_id
