"""Real training frameworks under jobwrap: killed mid-run, requeued, resumed bit-identically.

Each job is a real framework (torch CPU, from the framework venv tools/bootstrap makes)
writing real checkpoints in the sandbox as the test user: 2-node DDP over gloo with
torch.distributed.checkpoint, a Lightning Trainer, an HF Trainer, Accelerate save_state.
Attempt 0 is SIGKILLed mid-run (the DDP rank from outside, the others by themselves);
jobwrap classes it `killed`, requeues it, and hands the next attempt the newest valid
checkpoint in JOBWRAP_RESUME_FROM. The resumed run must end with the weights (sha256) of
an uninterrupted run of the same script, run beside it as the same user outside Slurm.

The four jobs and their reference runs are started together by one module fixture (the
machine has 2 cores and the jobs mostly wait on imports and Slurm); each test then
follows its own job. Training scripts: tests/fixtures/frameworks/.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from jobwrap_dev.sandbox.cluster import Cluster
from tests.sandbox import free_ports
from tests.support import framework_python, host_lock
from wrapper.checkpoints import latest_valid
from wrapper.slurm.parse import expand_hostlist

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "frameworks"
SCRIPTS = ("common.py", "ddp_dcp.py", "lightning_train.py", "hf_train.py",
           "accelerate_train.py")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}
# Loaded 2-core machine: importing torch alone can take 15 s with nothing printed, and
# four framework jobs import at once. The learned hang detection (40 s floor) would be
# right to end a job silent that long; these jobs say how long they may be silent.
HANG = "--hang-timeout=3m"


@dataclass
class Run:
    """One framework job in the sandbox and its uninterrupted reference run beside it."""

    name: str
    script: str
    knobs: dict[str, str]
    job_id: str = ""
    reference: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    @property
    def ckpt(self) -> str:
        return f"ckpt-{self.name}"


def job_script(run: Run, python: str, *, extra: str = "", launch: str = "") -> str:
    knobs = " ".join(f"{k}={v}" for k, v in run.knobs.items())
    return f"""#!/bin/bash
#SBATCH --output={run.name}-%j.out --open-mode=append {extra}
#JOBWRAP --checkpoint-dir={run.ckpt} --max-restarts=2 {HANG}
export {knobs} RESULT=$PWD/{run.name}-$SLURM_JOB_ID.hash
echo "attempt $JOBWRAP_ATTEMPT of {run.name} on $SLURMD_NODENAME"
{launch}{python} {run.script}
"""


def start_reference(cluster: Cluster, run: Run, python: str, logs: Path,
                    ranks: tuple[dict[str, str], ...] = ({},)) -> None:
    """The same script with the same knobs, never killed, as the test user outside Slurm
    (one process per entry of ``ranks``, with that entry's variables)."""
    user = pwd.getpwnam(cluster.spec.user)
    base = {"PATH": "/usr/bin:/bin", "HOME": user.pw_dir, **run.knobs,
            "CKPT": str(cluster.work / f"ref-{run.name}"),
            "RESULT": str(cluster.work / f"ref-{run.name}.hash")}
    base.pop("KILL_AT", None)
    for number, rank in enumerate(ranks):
        env = {**base, **rank}
        log = logs / f"ref-{run.name}-{number}.log"
        with log.open("wb") as out:
            run.reference.append(subprocess.Popen(
                ["runuser", "-u", user.pw_name, "--", "env", "-i",
                 *(f"{k}={v}" for k, v in env.items()), python, run.script],
                cwd=cluster.work, stdout=out, stderr=subprocess.STDOUT))
        run.logs.append(log)


def reference_hash(cluster: Cluster, run: Run) -> str:
    for proc, log in zip(run.reference, run.logs, strict=True):
        rc = proc.wait(timeout=300)
        assert rc == 0, f"reference run of {run.name} failed ({rc}):\n{log.read_text()}"
    return (cluster.work / f"ref-{run.name}.hash").read_text().strip()


@pytest.fixture(scope="module")
def runs(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    # four torch jobs and their uninterrupted references at once take this host's cores:
    # no other tier's or worker's torch run beside them (tests.support.host_lock)
    with host_lock():
        yield from _start_runs(cluster, tmp_path_factory)


def _start_runs(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[dict[str, Run]]:
    python = framework_python()
    for name in SCRIPTS:
        cluster.write_user_file(name, (FIXTURES / name).read_text())
    logs = tmp_path_factory.mktemp("framework-references")
    small = {"STEPS": "8", "SAVE_EVERY": "2", "STEP_SLEEP": "0.3"}
    job_port, ref_port = free_ports(2)
    all_runs = {
        "ddp": Run("ddp", "ddp_dcp.py", {"STEPS": "12", "SAVE_EVERY": "3",
                                         "STEP_SLEEP": "0.5"}),
        "lightning": Run("lightning", "lightning_train.py", {**small, "KILL_AT": "5"}),
        "hf": Run("hf", "hf_train.py", {**small, "KILL_AT": "5"}),
        "accelerate": Run("accelerate", "accelerate_train.py", {**small, "KILL_AT": "5"}),
    }
    for run in all_runs.values():
        for stale in (cluster.work / run.ckpt, cluster.work / f"ref-{run.name}"):
            shutil.rmtree(stale, ignore_errors=True)
        (cluster.work / f"ref-{run.name}.hash").unlink(missing_ok=True)
    ddp = all_runs["ddp"]
    ddp.job_id = cluster.submit(job_script(
        ddp, python, extra="--nodes=2 --ntasks-per-node=1",
        launch=f"export MASTER_ADDR=127.0.0.1 MASTER_PORT={job_port}\nsrun "),
        name="ddp.sh")
    for run in list(all_runs.values())[1:]:
        run.job_id = cluster.submit(job_script(run, python), name=f"{run.name}.sh")
    start_reference(cluster, ddp, python, logs, ranks=tuple(
        {"RANK": rank, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
         "MASTER_PORT": str(ref_port)} for rank in ("0", "1")))
    for run in list(all_runs.values())[1:]:
        start_reference(cluster, run, python, logs)
    yield all_runs
    for run in all_runs.values():
        for proc in run.reference:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def output_of(cluster: Cluster, run: Run) -> str:
    path = cluster.work / f"{run.name}-{run.job_id}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def finish(cluster: Cluster, run: Run) -> str:
    """Wait for the job's final state; its output, with that state appended."""
    info = cluster.wait_job(run.job_id, states=TERMINAL, timeout=360)
    return output_of(cluster, run) + f"\n[final {info['JobState']} restarts {info['Restarts']}]"


def root_ends(cluster: Cluster, run: Run) -> list[tuple[int, str, str]]:
    return [(e["attempt"], e["kind"], e["decision"])
            for e in cluster.events(run.job_id)
            if e["event"] == "attempt.end" and e["source"] == "root"]


def resumed_attempt(cluster: Cluster, run: Run) -> int:
    """The attempt that resumed: 1, or later by the attempts Slurm ran without jobwrap's
    prolog (22.05, on a node busy with the other framework jobs: see test_unchecked.py),
    which the task-prolog ended before the job's code and jobwrap requeued elsewhere."""
    return 1 + sum(1 for _a, kind, _d in root_ends(cluster, run) if kind == "unchecked")


def assert_killed_then_resumed(cluster: Cluster, run: Run, output: str) -> None:
    resumed = resumed_attempt(cluster, run)
    assert f"[final COMPLETED restarts {resumed}]" in output, output
    ends = root_ends(cluster, run)
    skipped = [(a, "unchecked", "requeue") for a in range(1, resumed)]
    assert ends == [(0, "killed", "requeue"), *skipped, (resumed, "success", "done")], \
        (ends, output)
    weights = (cluster.work / f"{run.name}-{run.job_id}.hash").read_text().strip()
    assert weights == reference_hash(cluster, run), \
        f"{run.name}: the resumed run's weights differ from an uninterrupted run's\n{output}"


def rank_process(job_id: str, rank: str) -> psutil.Process | None:
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "ddp_dcp.py" not in " ".join(proc.info["cmdline"] or ()):
                continue
            env = proc.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if env.get("SLURM_JOB_ID") == job_id and env.get("SLURM_PROCID") == rank:
            return proc
    return None


def wait_for(what: str, check: Callable[[], bool], timeout: float,
             context: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"no {what} after {timeout:g} s: {context()}"
        time.sleep(0.1)


def test_ddp_rank_killed_on_node_2_is_killed_and_resumes_past_a_damaged_checkpoint(
        cluster: Cluster, runs: dict[str, Run]) -> None:
    run = runs["ddp"]
    wait_for("rank 1 at step 7", lambda: "rank 1 step 7 done" in output_of(cluster, run), 240,
             lambda: output_of(cluster, run))
    rank0, rank1 = rank_process(run.job_id, "0"), rank_process(run.job_id, "1")
    assert rank0 is not None and rank1 is not None, output_of(cluster, run)
    env = rank1.environ()
    nodes = cluster.job(run.job_id)["NodeList"]
    rank1.send_signal(signal.SIGKILL)  # psutil refuses a pid reused since it was found
    # The survivor fails on its next collective; once it is gone nothing writes this
    # attempt's checkpoints, and the next attempt's task-prolog is seconds away (epilog,
    # requeue, prolog): the damage lands in between.
    try:
        rank0.wait(timeout=60)
    except psutil.TimeoutExpired:
        pytest.fail(f"rank 0 still runs 60 s after rank 1 was killed:\n{output_of(cluster, run)}")
    ckpt = cluster.work / run.ckpt
    complete = sorted((p for p in ckpt.iterdir() if (p / ".metadata").exists()),
                      key=lambda p: int(p.name.split("_")[1]))
    assert len(complete) >= 2, (complete, output_of(cluster, run))
    newest, previous = complete[-1], complete[-2]
    # Damage the newest as a lost page cache would: a shard cut short, mtime unchanged.
    shard = max(newest.glob("*.distcp"), key=lambda p: p.stat().st_size)
    st = shard.stat()
    os.truncate(shard, st.st_size // 2)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    seen = latest_valid(ckpt, settle_seconds=0)  # what the content checks say of it now
    assert seen.latest is not None and seen.latest.path == str(previous), seen
    reasons = {s.path: s.reason for s in seen.skipped}
    assert str(newest) in reasons, seen  # passed over for its content, not its age

    output = finish(cluster, run)
    # rank 1 ran on the job's second node (any two of the sandbox's three)
    node, allocated = env["SLURMD_NODENAME"], expand_hostlist(nodes)
    assert len(allocated) == 2 and node == allocated[1], (node, nodes)
    assert f"srun: error: {node}: task 1: Killed" in output, output
    step = previous.name.split("_")[1]
    for rank in ("0", "1"):
        assert f"rank {rank}: resumed from {previous} at step {step}" in output, output
    assert_killed_then_resumed(cluster, run, output)


def test_lightning_trainer_resumes_from_its_checkpoint(cluster: Cluster,
                                                       runs: dict[str, Run]) -> None:
    run = runs["lightning"]
    output = finish(cluster, run)
    assert "SIGKILL at step 5" in output, output
    # ModelCheckpoint saved epochs 2 and 4 (and last.ckpt, a copy of 4's); 5 was not saved.
    expected = cluster.work / run.ckpt / 'last.ckpt'
    assert f"attempt {resumed_attempt(cluster, run)} resume {expected}" in output, output
    assert "training from epoch 4" in output, output
    assert_killed_then_resumed(cluster, run, output)


def test_hf_trainer_resumes_from_checkpoint_n(cluster: Cluster, runs: dict[str, Run]) -> None:
    run = runs["hf"]
    output = finish(cluster, run)
    assert "SIGKILL at step 5" in output, output
    expected = cluster.work / run.ckpt / 'checkpoint-4'
    assert f"attempt {resumed_attempt(cluster, run)} resume {expected}" in output, output
    assert_killed_then_resumed(cluster, run, output)


def test_accelerate_save_state_resumes_from_checkpoint_n(cluster: Cluster,
                                                         runs: dict[str, Run]) -> None:
    run = runs["accelerate"]
    output = finish(cluster, run)
    assert "SIGKILL at step 5" in output, output
    # save_state ran after steps 2 and 4: checkpoints/checkpoint_0 and checkpoint_1
    expected = cluster.work / run.ckpt / "checkpoints" / "checkpoint_1"
    assert f"attempt {resumed_attempt(cluster, run)} resume {expected}" in output, output
    assert_killed_then_resumed(cluster, run, output)
