"""The walltime signal reaches a job that runs no srun step: its batch shell gets it."""

from __future__ import annotations

from typing import Any

from jobwrap_dev.sandbox.cluster import Cluster


def test_a_job_without_steps_gets_the_walltime_signal_in_its_batch_shell(
        cluster: Cluster) -> None:
    job_id = cluster.submit(
        "#!/bin/bash\n#SBATCH --time=1\n#SBATCH --output=nostep-%j.out\n"
        "trap 'echo got URG in the batch shell; exit 0' URG\n"
        "for i in $(seq 120); do sleep 0.5; done\necho never signalled\n", name="nostep.sh")
    info = cluster.wait_job(job_id, timeout=90)
    output = (cluster.work / f"nostep-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED", (info, output)
    assert "got URG in the batch shell" in output and "never signalled" not in output, output
    events = [e for e in cluster.events(job_id)
              if e["event"] == "walltime.signal"]
    assert len(events) == 1 and events[0]["signal"] == "URG", events


def test_a_job_that_requeues_itself_is_recorded_and_not_requeued_twice(
        cluster: Cluster) -> None:
    """What Lightning's auto-requeue does on its signal: ``scontrol requeue`` of its own job.
    Slurm's Restarts moves without jobwrap; the epilog records it and does not requeue
    again (a second requeue would kill the next attempt or be refused)."""
    job_id = cluster.submit(
        "#!/bin/bash\n#SBATCH --output=selfrq-%j.out --open-mode=append\n"
        "#JOBWRAP --max-restarts=3\n"
        "echo \"run restarts=${SLURM_RESTART_COUNT:-0}\"\n"
        "if [ \"${SLURM_RESTART_COUNT:-0}\" = 0 ]; then\n"
        "  scontrol requeue \"$SLURM_JOB_ID\"; sleep 60; echo 'not requeued'\nfi\n"
        "echo finished\n", name="selfrq.sh")
    # CANCELLED is Slurm's passing state of a requeue: wait for the real end
    info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED"}, timeout=150)
    output = (cluster.work / f"selfrq-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, output)
    assert output.count("run restarts=") == 2 and "not requeued" not in output, output
    assert output.count("finished") == 1, output
    events = cluster.events(job_id)
    external = [(e["attempt"], e["restarts"]) for e in events
                if e["event"] == "requeue.external" and e["source"] == "root"]
    assert external == [(0, 1)], events
    assert not [e for e in events if e["event"] == "requeue.failed"], events
    ends = [(e["attempt"], e["decision"]) for e in events
            if e["event"] == "attempt.end" and e["source"] == "root"]
    assert ends == [(0, "requeue"), (1, "done")], ends
    epilogs = [e["attempt"] for e in events if e["event"] == "epilog.context"]
    assert epilogs == [0, 1], epilogs  # Slurm's count had moved: the ended attempt is 0
    assert "requeued without jobwrap" in output and "does not requeue it again" in output


def test_before_the_limit_a_saved_job_is_requeued_at_once_and_loses_no_step(
        cluster: Cluster) -> None:
    """The supervisor touches the job's save file (JOBWRAP_SAVE_FILE) with its signal; a
    checkpoint newer than that, complete, and it requeues the job then instead of letting
    it train on to the limit. With --max-restarts=1 the second attempt may not be
    requeued: it runs on to its end."""
    import shutil
    from pathlib import Path

    import jobwrap_dev.sandbox

    payload = Path(jobwrap_dev.sandbox.__file__).parent / "toy_train.py"
    cluster.write_user_file("train.py", payload.read_text())
    shutil.rmtree(cluster.work / "ckpt-wtsave", ignore_errors=True)
    steps = 40
    job_id = cluster.submit(
        "#!/bin/bash\n#SBATCH --time=2 --output=wtsave-%j.out --open-mode=append\n"
        "#JOBWRAP --checkpoint-dir=ckpt-wtsave --max-restarts=1\n"
        "echo \"save file: $JOBWRAP_SAVE_FILE\"\n"
        f"python3 train.py {steps} 0.3\n", name="wtsave.sh")
    info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED", "TIMEOUT"}, timeout=150)
    output = (cluster.work / f"wtsave-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, output)
    assert f"done sum {steps * (steps + 1) // 2}" in output, output
    assert f"save file: {cluster.work}/ckpt-wtsave/.jobwrap-save-now" in output, output
    events = cluster.events(job_id)
    requeued = _requeued_once_and_resumed(events, output)
    assert requeued["seconds_left"] > 60, requeued
    assert "requeued before its time limit by jobwrap's supervisor once the checkpoint " \
        "it asked for was saved" in output, output


def test_a_time_limit_lowered_while_the_job_runs_moves_the_save_and_requeue_before_it(
        cluster: Cluster) -> None:
    """The job starts with 30 minutes; once it trains, its owner lowers the limit to 4
    (``scontrol update JobId= TimeLimit=4``). The supervisor's periodic ask to Slurm
    carries the new limit: it asks the job to save and requeues it before the new limit,
    not 5 minutes before the old one (which would be after Slurm had ended it)."""
    import shutil
    import time
    from pathlib import Path

    import jobwrap_dev.sandbox

    payload = Path(jobwrap_dev.sandbox.__file__).parent / "toy_train.py"
    cluster.write_user_file("train.py", payload.read_text())
    shutil.rmtree(cluster.work / "ckpt-wtlower", ignore_errors=True)
    steps, new_limit = 80, 240  # the supervisor sees the new limit within ~15 s
    job_id = cluster.submit(
        "#!/bin/bash\n#SBATCH --time=30 --output=wtlower-%j.out --open-mode=append\n"
        "#JOBWRAP --checkpoint-dir=ckpt-wtlower --max-restarts=1\n"
        f"python3 train.py {steps} 0.5\n", name="wtlower.sh")
    out = cluster.work / f"wtlower-{job_id}.out"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (
            out.exists() and "step 5 " in out.read_text()
            and any(e["event"] == "supervisor.start" for e in cluster.events(job_id))):
        time.sleep(0.5)
    assert "step 5 " in out.read_text(), out.read_text()
    assert not any(e["event"] == "walltime.signal" for e in cluster.events(job_id))
    cluster.as_user(["scontrol", "update", f"JobId={job_id}", f"TimeLimit={new_limit // 60}"])
    info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED", "TIMEOUT"}, timeout=400)
    output = out.read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, output)
    assert f"done sum {steps * (steps + 1) // 2}" in output, output
    events = cluster.events(job_id)
    signals = [e for e in events if e["event"] == "walltime.signal" and e["attempt"] == 0]
    assert len(signals) == 1 and 0 < signals[0]["seconds_left"] < new_limit, signals
    requeued = _requeued_once_and_resumed(events, output)
    assert 0 < requeued["seconds_left"] < new_limit, requeued


def _requeued_once_and_resumed(events: list[dict[str, Any]], output: str) -> dict[str, Any]:
    """The first attempt was requeued by the supervisor once saved, and the next one
    resumed from the checkpoint the save made: no step lost or redone. Its event."""
    [requeued] = [e for e in events if e["event"] == "walltime.requeued"]
    assert requeued["attempt"] == 0, requeued
    saved = int(str(requeued["checkpoint"]).rsplit("step=", 1)[1].split(".")[0])
    starts = [int(line.rsplit("start=", 1)[1]) for line in output.splitlines()
              if line.startswith("attempt=") and "start=" in line]
    assert starts[0] == 0 and starts[1] >= saved, (starts, saved, output)
    ends = [(e["attempt"], e["kind"], e["decision"]) for e in events
            if e["event"] == "attempt.end" and e["source"] == "root"]
    # root's facts (Slurm's Restarts and time limit, the attempt's start) class the saved,
    # requeued attempt: its time limit ended it, though its batch script ended clean
    assert ends == [(0, "walltime", "requeue"), (1, "success", "done")], ends
    return requeued
