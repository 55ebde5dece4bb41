"""What Slurm's cgroup containment changes, on the sandbox that runs it as sites do.

The sandbox runs proctrack/cgroup, task/cgroup with ConstrainDevices, ConstrainRAMSpace and
ConstrainCores, PrologFlags=Alloc,Contain and jobacct_gather/cgroup (docs/containment.md).
Here: a job reaches only its own GPUs' device files; a real out-of-memory kill under its
memory limit is classed host_oom from Slurm's and the cgroup's facts (a job that only
prints an OOM-like message plays an attack, in
tests/adversarial/test_forged_oom_kill_in_job_output.py); jobwrap's supervisor and
watchers live outside the job's cgroups, so Slurm's kill of the job leaves them to
finish, and after the job no process, cgroup or mount of it is left.
"""

from __future__ import annotations

import errno
import shutil
import time
from pathlib import Path

import psutil

import jobwrap_dev.sandbox
from jobwrap_dev.sandbox.cluster import Cluster
from wrapper.runner import Runner

PAYLOAD = Path(jobwrap_dev.sandbox.__file__).parent / "toy_train.py"
CONTROLLERS = ("freezer", "cpuset", "memory", "devices", "cpuacct")


def root_ends(cluster: Cluster, job_id: str) -> list[tuple[int, str, str]]:
    return [(e["attempt"], e["kind"], e["detail"])
            for e in cluster.events(job_id)
            if e["event"] == "attempt.end" and e["source"] == "root"]


def job_cgroups(job_id: str) -> list[str]:
    """Every cgroup v1 folder of ``job_id`` on this host, under any slurmd's tree."""
    return [str(p) for c in CONTROLLERS
            for p in Path("/sys/fs/cgroup", c).glob(f"slurm*/uid_*/job_{job_id}")]


def test_the_sandbox_runs_the_containment_sites_run(cluster: Cluster) -> None:
    assert cluster.spec.containment == "cgroup", \
        "the e2e tier runs on the cgroup sandbox: unset JOBWRAP_SANDBOX_CONTAINMENT"
    conf = Runner(cluster.env()).run(["scontrol", "show", "config"], timeout=20).stdout
    settings = {k.strip(): v.strip() for k, _, v in
                (line.partition("=") for line in conf.splitlines()) if v}
    assert settings["ProctrackType"] == "proctrack/cgroup", settings["ProctrackType"]
    assert {"task/cgroup", "task/affinity"} <= set(settings["TaskPlugin"].split(","))
    assert settings["JobAcctGatherType"] == "jobacct_gather/cgroup"
    assert {"Alloc", "Contain"} <= set(settings["PrologFlags"].split(","))
    for key in ("ConstrainCores", "ConstrainDevices", "ConstrainRAMSpace"):
        assert settings[key] == "yes", (key, settings.get(key))


def test_a_job_reaches_only_its_own_gpus(cluster: Cluster) -> None:
    """By device access, not by an environment variable: the allocated GPUs' device files
    pass the devices cgroup (and then find no driver: ENXIO), the others are refused
    (EPERM), in the batch step and in an srun step alike."""
    probe = f"""import os, sys
for minor in range({cluster.spec.gpus_per_node}):
    try:
        os.close(os.open("{cluster.base}/dev/nvidia%d" % minor, os.O_RDONLY))
        print(sys.argv[1], minor, "open")
    except OSError as exc:
        print(sys.argv[1], minor, exc.errno)
"""
    cluster.write_user_file("devprobe.py", probe)
    job_id = cluster.submit("""#!/bin/bash
#SBATCH --nodes=1 --gres=gpu:2 --output=dev-%j.out --no-requeue
echo "gpus=$SLURM_JOB_GPUS"
python3 devprobe.py batch
srun --ntasks=1 python3 devprobe.py step
""", name="dev.sh")
    info = cluster.wait_job(job_id, timeout=90)
    output = (cluster.work / f"dev-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED", (info, output)
    mine = {int(g) for g in output.split("gpus=")[1].split()[0].split(",")}
    assert len(mine) == 2, output
    for where in ("batch", "step"):
        seen = {int(m): r for w, m, r in (line.split() for line in output.splitlines()
                                         if line.startswith(f"{where} "))}
        assert set(seen) == set(range(cluster.spec.gpus_per_node)), output
        for minor, result in seen.items():
            want = errno.ENXIO if minor in mine else errno.EPERM
            assert result == str(want), (where, minor, result, mine, output)


def test_a_real_oom_kill_is_host_oom(cluster: Cluster) -> None:
    real = cluster.submit("""#!/bin/bash
#SBATCH --nodes=1 --mem=150M --output=oom-%j.out --no-requeue
python3 -c "
chunks = []
for _ in range(60):
    chunks.append(bytearray(20 << 20))
print('sur' + 'vived')
"
""", name="oom.sh")
    cluster.wait_job(real, timeout=90)
    deadline = time.monotonic() + 30
    while not root_ends(cluster, real):
        assert time.monotonic() < deadline, "no epilog decision"
        time.sleep(0.3)
    real_out = (cluster.work / f"oom-{real}.out").read_text()
    assert "survived" not in real_out, real_out
    [(_, kind, detail)] = root_ends(cluster, real)
    assert kind == "host_oom", (kind, detail, real_out)


def test_supervisor_and_watchers_outlive_the_jobs_cgroup_and_leave_nothing(
        cluster: Cluster) -> None:
    cluster.write_user_file("train.py", PAYLOAD.read_text())
    shutil.rmtree(cluster.work / "ckpt-contain", ignore_errors=True)
    job_id = cluster.submit("""#!/bin/bash
#SBATCH --nodes=2 --gres=gpu:1 --output=contain-%j.out --no-requeue
#JOBWRAP --checkpoint-dir=ckpt-contain
srun --ntasks=2 --ntasks-per-node=1 python3 train.py 200 0.5
""", name="contain.sh")
    deadline = time.monotonic() + 60
    helpers: list[psutil.Process] = []
    while time.monotonic() < deadline:
        starts = [e for e in cluster.events(job_id) if e["source"] == "root" and
                  e["event"] in ("supervisor.started", "watch.started")]
        if len(starts) == 3 and job_cgroups(job_id) and \
                list((cluster.work / "ckpt-contain").glob("*.ckpt")):
            break  # training: the job's tasks run in its cgroups
        time.sleep(0.3)
    assert len(starts) == 3, starts  # the supervisor, a watcher on each node
    for start in starts:
        pid = int(start["pid"]) if "pid" in start else int(start["how"].split(":")[1])
        helpers.append(psutil.Process(pid))
    for proc in helpers:
        cgroups = Path(f"/proc/{proc.pid}/cgroup").read_text()
        assert f"job_{job_id}" not in cgroups, (proc.cmdline(), cgroups)
    Runner(cluster.env()).run(["scancel", job_id], timeout=20)
    cluster.wait_job(job_id, timeout=90)
    deadline = time.monotonic() + 60
    while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in helpers) \
            or job_cgroups(job_id):
        assert time.monotonic() < deadline, (
            [p.pid for p in helpers if p.is_running()], job_cgroups(job_id))
        time.sleep(0.3)
    events = cluster.events(job_id)
    # The supervisor saw the end itself (it was not killed with the job) ...
    assert any(e["event"] == "supervisor.end" for e in events), \
        [e["event"] for e in events]
    # ... the epilog decided, and nothing of the job is left on the host.
    assert len(root_ends(cluster, job_id)) == 1, root_ends(cluster, job_id)
    assert not job_cgroups(job_id)
    mounts = Path("/proc/self/mounts").read_text()
    assert job_id not in mounts, mounts
    left = [p.info["pid"] for p in psutil.process_iter(["pid", "cmdline"])
            if job_id in " ".join(p.info["cmdline"] or [])]
    assert not left, left
