"""``jobwrap sandbox demo``: run a 2-node GPU job as the test user and show what each hook saw."""

from __future__ import annotations

from collections.abc import Callable

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


def run_demo(cluster: Cluster, echo: Callable[[str], None] = print) -> str:
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
        ctx = event.get("context", {})
        echo(f"{ctx.get('hook', '?'):<12} {ctx.get('node', '?'):<5} {event['source']:<6} "
             f"{ctx.get('user', '?'):<8} {','.join(map(str, ctx.get('gpus', []))) or '-':<6} "
             f"{ctx.get('attempt', '?')}")
    return job_id
