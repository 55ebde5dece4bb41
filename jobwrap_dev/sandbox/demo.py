"""``python -m jobwrap_dev sandbox demo``: what jobwrap does, part by part, on the sandbox cluster.

1. a bad GPU: its node drained with jobwrap's precise reason, the job runs on the other;
2. staging: a dataset copied to the job's scratch, and a second job served by the cache;
3. a PyTorch Lightning job killed mid-run, resumed from its checkpoint through a requeue;
   ``jobwrap status``; the same job under ``jobwrap run --``, restarted inside its
   allocation;
4. the archive: ``jobwrap archive list`` and ``archive show`` (the manifest);
5. the login guard, dry run, flagging a ``torchrun`` started on the "login node";
6. ``jobwrap doctor`` on the sandbox.

Every wait prints a progress line at least every few seconds. Each part returns what it
showed, so a test can check the demo's claims rather than its wording.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobwrap_dev.sandbox.cluster import TERMINAL_STATES, Cluster
from jobwrap_dev.sandbox.daemons import SandboxError
from wrapper.job import events as ev
from wrapper.runner import Runner

Echo = Callable[[str], None]
PARTS = 6
EVERY = 3.0  # seconds between two progress lines while waiting

HEALTH_JOB = """#!/bin/bash
#SBATCH --job-name=demo-health
#SBATCH --gres=gpu:1
#SBATCH --output=health-%j.out
echo "ran on $SLURMD_NODENAME with GPU $CUDA_VISIBLE_DEVICES"
"""

STAGE_JOB = """#!/bin/bash
#SBATCH --job-name=demo-stage
#SBATCH --output=stage-%j.out
#JOBWRAP --stage-in={work}/dataset:data
echo "scratch $JOBWRAP_SCRATCH holds $(find "$JOBWRAP_SCRATCH/data" -type f | wc -l) files"
"""

# The framework virtualenv tools/bootstrap makes (torch 2.13 CPU, Lightning, transformers...).
FRAMEWORKS = Path(os.environ.get("JOBWRAP_FRAMEWORKS", "/opt/jobwrap/frameworks"))

TRAIN_JOB = """#!/bin/bash
#SBATCH --job-name=demo-train
#SBATCH --gres=gpu:1
#SBATCH --output=train-%j.out
#SBATCH --open-mode=append
#JOBWRAP --checkpoint-dir=ckpt-demo --max-restarts=2
# PyTorch Lightning, 8 epochs, a ModelCheckpoint after each; attempt 0 is SIGKILLed at epoch 4
export PYTHONWARNINGS=ignore
KILL_AT=4 {python} lightning_train.py 8
"""

# The same job with one line changed: ``jobwrap run --`` restarts it inside the allocation.
INPLACE_JOB = TRAIN_JOB.replace("demo-train", "demo-inplace").replace(
    "train-%j.out", "inplace-%j.out").replace("ckpt-demo", "ckpt-demo-inplace").replace(
    "KILL_AT=4 {python}", "KILL_AT=4 {jobwrap} run -- {python}")

MAKE_DATASET = """import os, shutil, sys
data = sys.argv[1]
shutil.rmtree(data, ignore_errors=True)
os.makedirs(os.path.join(data, "shards"))
for i in range(200):
    with open(os.path.join(data, "shards", f"part-{i:04d}.bin"), "wb") as f:
        f.write(os.urandom(4096))
with open(os.path.join(data, "labels.bin"), "wb") as f:
    f.write(os.urandom(4 * 2**20))
"""

# A training launcher as a user would start it on a login node: a program named torchrun.
TORCHRUN = """#!/usr/bin/python3
import time
time.sleep(120)
"""


def run_demo(cluster: Cluster, echo: Echo = print) -> dict[str, Any]:
    """All six parts, in order; returns what each showed (part name -> facts)."""
    started = time.monotonic()
    shown: dict[str, Any] = {}
    took: list[str] = []
    parts: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("bad_gpu", lambda: bad_gpu(cluster, echo)),
        ("staging", lambda: staging(cluster, echo)),
        ("resume", lambda: resume(cluster, echo)),
        ("archive", lambda: archive(cluster, echo, shown["resume"]["job"])),
        ("login_guard", lambda: login_guard(cluster, echo)),
        ("doctor", lambda: doctor(cluster, echo))]
    for number, (name, part) in enumerate(parts, start=1):
        begun = time.monotonic()
        shown[name] = part()
        took.append(f"{number}: {time.monotonic() - begun:.0f} s")
    echo(f"\ndemo done: {PARTS} parts in {time.monotonic() - started:.0f} s ({', '.join(took)})")
    return shown


# -- part 1 --------------------------------------------------------------------------------
def bad_gpu(cluster: Cluster, echo: Echo) -> dict[str, Any]:
    header(echo, 1, "a bad GPU: its node drained with the reason, the job runs elsewhere")
    node = cluster.spec.nodes[0]
    cluster.set_gpu_faults(node, {0: {"row_remap_failed": True}})
    echo(f"injected a fault: {node} gpu0 'row remapping failed' "
         f"(the fake GPU inventory {cluster.gpu_inventory(node)})")
    try:
        job_id = cluster.submit(HEALTH_JOB, name="health.sh")
        echo(f"submitted job {job_id} as {cluster.spec.user}: 1 GPU, any node")
        drained: dict[str, str] = {}

        def probe() -> tuple[bool, str]:
            state, reason = node_reason(cluster, node)
            info = cluster.job(job_id)
            drained.update(state=state, reason=reason)
            done = state.startswith("drain") or info.get("JobState") in TERMINAL_STATES
            return done, f"{node} {state}; job {info.get('JobState')} {info.get('NodeList')}"

        wait_for(echo, f"the prolog's health check on {node}", probe, timeout=60)
        echo(f"sinfo: {node} {drained['state']}, reason \"{drained['reason']}\"")
        seen: list[str] = []
        info = wait_job(cluster, echo, job_id, timeout=90, seen=seen)
        held = any("held" in note.lower() for note in seen)
        out = read(cluster.work / f"health-{job_id}.out")
        echo(f"job {job_id} {info.get('JobState')} on {info.get('NodeList')} after "
             f"{info.get('Restarts')} requeue(s), {'HELD' if held else 'never held'}; "
             "its output:")
        echo(indent(out))
        return {"job": job_id, "node": node, "state": drained["state"],
                "reason": drained["reason"], "job_state": info.get("JobState"),
                "ran_on": info.get("NodeList"), "held": held, "output": out}
    finally:
        cluster.set_gpu_faults(node)
        res = jobwrap(cluster, "check", "--resume", "--node", node)
        said = (res.stdout + res.stderr).strip().splitlines()
        echo(f"GPU repaired; $ jobwrap check --resume --node {node}: "
             f"{said[-1] if said else f'exit {res.returncode}'}")
        wait_for(echo, f"{node} back in service", lambda: idle(cluster), timeout=30)


# -- part 2 --------------------------------------------------------------------------------
def staging(cluster: Cluster, echo: Echo) -> dict[str, Any]:
    header(echo, 2, "a dataset staged to node-local scratch; the second job hits the cache")
    data = cluster.work / "dataset"
    # made by the user, with the user's rights: root writes nothing in the user's folder
    cluster.as_user(["python3", "-c", MAKE_DATASET, str(data)], timeout=60)
    files = [p for p in data.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files) / 2**20
    echo(f"dataset {data}: {len(files)} files, {size:.1f} MiB, the user's; each job asks "
         f"#JOBWRAP --stage-in={data}:data")
    node = cluster.spec.nodes[1]
    runs = []
    for label in ("first job", "second job"):
        job_id = cluster.submit(STAGE_JOB.format(work=cluster.work), f"--nodelist={node}",
                                name="stage.sh")
        echo(f"{label}: {job_id} on {node}")
        wait_job(cluster, echo, job_id, timeout=60)
        [event] = [e for e in cluster.events(job_id)
                   if e.get("event") == ev.StagingIn.KIND] or [{}]
        echo(f"  staged in {event.get('files')} files, {event.get('bytes')} bytes in "
             f"{event.get('seconds')} s; cache hits {event.get('cache_hits')}")
        echo("  " + read(cluster.work / f"stage-{job_id}.out"))
        runs.append({"job": job_id, **{k: event.get(k) for k in
                                       ("files", "bytes", "seconds", "cache_hits")}})
    echo("the second job's data came from the node's cache (root's, keyed by the tree's "
         "digest); scratch is removed after each job")
    return {"runs": runs}


# -- part 3 --------------------------------------------------------------------------------
def resume(cluster: Cluster, echo: Echo) -> dict[str, Any]:
    header(echo, 3, "a PyTorch Lightning job killed mid-run, resumed from its checkpoint")
    python = FRAMEWORKS / "bin" / "python"
    if not os.access(python, os.X_OK):
        raise SandboxError(f"{python} is missing: run tools/bootstrap (it makes the framework "
                           "virtualenv the training part runs in)")
    shutil.rmtree(cluster.work / "ckpt-demo", ignore_errors=True)
    cluster.write_user_file("lightning_train.py",
                            (Path(__file__).parent / "lightning_train.py").read_text())
    job_id = cluster.submit(TRAIN_JOB.format(python=python), name="train.sh")
    echo(f"job {job_id}: Lightning Trainer, 8 epochs, a checkpoint each; the first attempt "
         "is SIGKILLed as epoch 4 starts")
    info = wait_job(cluster, echo, job_id, timeout=240)
    out = read(cluster.work / f"train-{job_id}.out")
    echo(f"job {job_id} {info.get('JobState')} after {info.get('Restarts')} requeue(s); "
         "its output (the resumed attempt continues at epoch 4; the weights' hash equals an "
         "uninterrupted run's):")
    echo(indent("\n".join(line for line in out.splitlines() if "loss=" not in line
                          or "epoch=3 " in line or "epoch=4 " in line)))
    status = jobwrap(cluster, "status", job_id)
    echo(f"\n$ jobwrap status {job_id}")
    echo(indent(status.stdout.rstrip() or status.stderr.rstrip()))
    return {"job": job_id, "job_state": info.get("JobState"), "output": out,
            "status": status.stdout, "inplace": in_place(cluster, echo, python)}


def in_place(cluster: Cluster, echo: Echo, python: Path) -> dict[str, Any]:
    """The same job and kill, its command under ``jobwrap run --``: restarted inside the
    allocation, without Slurm's queue."""
    shutil.rmtree(cluster.work / "ckpt-demo-inplace", ignore_errors=True)
    launcher = cluster.runtime / "venv" / "bin" / "jobwrap"
    job_id = cluster.submit(INPLACE_JOB.format(python=python, jobwrap=launcher),
                            name="inplace.sh")
    echo(f"\nthe same job with one line changed, its command under `jobwrap run --` "
         f"(job {job_id}):\n    KILL_AT=4 jobwrap run -- python lightning_train.py 8")
    started = time.monotonic()
    info = wait_job(cluster, echo, job_id, timeout=240)
    out = read(cluster.work / f"inplace-{job_id}.out")
    echo(f"job {job_id} {info.get('JobState')} after {info.get('Restarts')} requeue(s), in "
         f"{time.monotonic() - started:.0f} s; restarted inside its allocation:")
    echo(indent("\n".join(line for line in out.splitlines() if line.startswith(
        ("jobwrap run:", "attempt 0:", "done")))))
    return {"job": job_id, "job_state": info.get("JobState"),
            "restarts": info.get("Restarts"), "output": out}


# -- part 4 --------------------------------------------------------------------------------
def archive(cluster: Cluster, echo: Echo, job_id: str) -> dict[str, Any]:
    header(echo, 4, "the archive: every job's logs and its manifest")
    listing = wait_for(echo, f"job {job_id}'s archive", lambda: archived(cluster, job_id),
                       timeout=30)
    echo("$ jobwrap archive list")
    echo(indent(listing))
    show = jobwrap(cluster, "archive", "show", job_id)
    echo(f"$ jobwrap archive show {job_id}")
    echo(indent(show.stdout.rstrip() or show.stderr.rstrip()))
    return {"list": listing, "show": show.stdout}


def archived(cluster: Cluster, job_id: str) -> tuple[bool, str]:
    res = jobwrap(cluster, "archive", "list")
    rows = [line.split() for line in res.stdout.splitlines()]
    done = any(row[:1] == [job_id] and "complete" in " ".join(row) for row in rows)
    return done, res.stdout.rstrip() if done else "waiting for the epilog's archive"


# -- part 5 --------------------------------------------------------------------------------
def login_guard(cluster: Cluster, echo: Echo) -> dict[str, Any]:
    header(echo, 5, "the login guard: training started on a login node (dry run)")
    from wrapper.config import Config, LogConfig, LoginGuardConfig, PathsConfig, to_toml

    config = cluster.base / "etc" / "login-guard.toml"
    config.write_text(to_toml(Config(
        paths=PathsConfig(state_dir=str(cluster.base / "jobwrap" / "login-guard")),
        log=LogConfig(file=""),
        login_guard=LoginGuardConfig(ai_window=0.0, ai_actions=("warn",)))))
    launcher = cluster.write_user_file("torchrun", TORCHRUN, 0o755)
    proc = subprocess.Popen(["runuser", "-u", cluster.spec.user, "--", str(launcher)],
                            cwd=cluster.work, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pid = wait_for(echo, "the user's torchrun to start",
                       lambda: child_named(proc.pid, "torchrun"), timeout=20)
        echo(f"{cluster.spec.user} started {launcher} (pid {pid}) on this 'login node'")
        echo(f"$ jobwrap --config {config} login-guard --once --dry-run")
        res = jobwrap(cluster, "login-guard", "--once", "--dry-run", config=config)
        lines = res.stdout.splitlines()
        mine = [line for i, line in enumerate(lines) if i == 0 or
                line.startswith(f"  {cluster.spec.user} ") or
                (i > 0 and lines[i - 1].startswith(f"  {cluster.spec.user} "))]
        echo(indent("\n".join(mine) or res.stderr.strip()))
        echo("(a real guard runs as a service: warns, then throttles, then stops it)")
        return {"pid": pid, "report": res.stdout, "returncode": res.returncode}
    finally:
        stop(proc)


def child_named(pid: int, name: str) -> tuple[bool, str]:
    import psutil

    with contextlib.suppress(psutil.Error):
        for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
            if proc.name() == name:
                return True, str(proc.pid)
    return False, "starting"


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill the runuser we started and what it runs, by pid."""
    import psutil

    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait(timeout=10)


# -- part 6 --------------------------------------------------------------------------------
def doctor(cluster: Cluster, echo: Echo) -> dict[str, Any]:
    header(echo, 6, "jobwrap doctor: is this cluster set up right?")
    node = cluster.spec.nodes[0]
    echo(f"$ jobwrap doctor --slurm-conf {cluster.conf} --node {node}")
    res = jobwrap(cluster, "doctor", "--slurm-conf", str(cluster.conf), "--node", node)
    echo(indent(res.stdout.rstrip() or res.stderr.rstrip()))
    return {"returncode": res.returncode, "report": res.stdout}


# -- helpers -------------------------------------------------------------------------------
def header(echo: Echo, number: int, title: str) -> None:
    echo(f"\n=== part {number}/{PARTS}: {title}")


def indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines())


def read(path: Path) -> str:
    return path.read_text().rstrip() if path.exists() else f"(no {path})"


def wait_for(echo: Echo, what: str, probe: Callable[[], tuple[bool, str]], *,
             timeout: float) -> str:
    """Poll ``probe`` (done, note) until done; a progress line at least every EVERY s."""
    start = time.monotonic()
    last, said = start, ""
    while True:
        done, note = probe()
        if done:
            return note
        now = time.monotonic()
        if now - start > timeout:
            raise SandboxError(f"{what}: not done after {timeout:g} s ({note})")
        if note != said or now - last >= EVERY:
            echo(f"  ... {what}: {note} ({now - start:.0f} s)")
            last, said = now, note
        time.sleep(0.3)


def wait_job(cluster: Cluster, echo: Echo, job_id: str, *, timeout: float,
             seen: list[str] | None = None) -> dict[str, str]:
    """Wait for the job's end (through its requeues); ``seen`` collects each state noted."""
    info: dict[str, str] = {}
    notes = [] if seen is None else seen

    def probe() -> tuple[bool, str]:
        info.clear()
        info.update(cluster.job(job_id))
        state = info.get("JobState", "?")
        where = info.get("NodeList") or ""
        reason = info.get("Reason") or ""
        note = f"{state} {where if where not in ('', '(null)') else ''}".rstrip()
        if reason not in ("", "None"):
            note += f" ({reason})"
        restarts = info.get("Restarts", "0")
        notes.append(note)
        return state in TERMINAL_STATES, note + (f", requeued {restarts}x"
                                                 if restarts not in ("", "0") else "")

    wait_for(echo, f"job {job_id}", probe, timeout=timeout)
    return info


def node_reason(cluster: Cluster, node: str) -> tuple[str, str]:
    out = Runner(cluster.env()).run(["sinfo", "-h", "-N", "-n", node, "-o", "%T|%E"],
                                    timeout=10, check=False).stdout.strip()
    state, _, reason = out.partition("|")
    return state, reason


def idle(cluster: Cluster) -> tuple[bool, str]:
    states = cluster.node_states()
    note = ", ".join(f"{n} {s}" for n, s in sorted(states.items()))
    return bool(states) and all(s.startswith("idle") for s in states.values()), note


def jobwrap(cluster: Cluster, *args: str, config: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
    """The sandbox's installed ``jobwrap``, as root, on the sandbox's config."""
    return subprocess.run([str(cluster.runtime / "venv" / "bin" / "jobwrap"), "--config",
                           str(config or cluster.jobwrap_config), *args], capture_output=True,
                          text=True, env=cluster.env(), timeout=60, check=False, cwd="/")
