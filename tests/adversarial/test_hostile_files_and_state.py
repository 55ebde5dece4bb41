"""Attacks on the OS-safety layer: the job's output, its state folder, root's Python.

Each plays an ordinary user against the real hooks (issue 12 items 2, 3, 10, 15) and
asserts what an admin relies on: the hook ends, no node drains, the archive is written,
nothing of one user reaches another.
"""

from __future__ import annotations

import json
import os
import pwd
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from jobwrap_dev.sandbox.cluster import Cluster
from tests.adversarial.conftest import run_as_slurmd, slurmd_env
from wrapper.job.state import PRUNE_STAMP, USER_EVENTS
from wrapper.osl.users import UserIds


def as_user(cluster: Cluster, user: str, argv: list[str], *,
            timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """``argv`` run by ``user`` (conftest's helper finds no runuser on a bare PATH)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "SLURM_CONF": str(cluster.conf),
           "HOME": pwd.getpwnam(user).pw_dir, "LANG": "C.UTF-8"}
    runuser = shutil.which("runuser", path="/usr/sbin:/sbin:/usr/bin:/bin") or "runuser"
    return subprocess.run([runuser, "-u", user, "--", *argv], env=env, cwd="/",
                          capture_output=True, text=True, timeout=timeout, check=False)


def _log_offset(cluster: Cluster) -> dict[str, int]:
    return cluster.log_marks()


def _hook_errors(cluster: Cluster, since: dict[str, int], job_id: str) -> list[dict[str, object]]:
    """hook.bug / hook.failed lines the hooks logged for ``job_id`` after ``since``."""
    lines = cluster.log_since(since)
    found = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") in ("hook.bug", "hook.failed") and \
                str(record.get("job_id")) == job_id:
            found.append(record)
    return found


def _not_drained(cluster: Cluster) -> None:
    states = cluster.node_states()
    assert not any("drain" in s for s in states.values()), states


def _finished_job(cluster: Cluster, script: str, name: str) -> tuple[str, dict[str, str]]:
    job_id = cluster.submit(script, name=name)
    info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED"}, timeout=100)
    return job_id, info


def test_a_fifo_in_place_of_the_output_cannot_hang_the_epilog(cluster: Cluster) -> None:
    """Item 2: the job swaps its --output for a FIFO; the epilog must still finish.

    (No requeue: a next attempt would hang in slurmstepd itself, which opens the FIFO
    for writing before anything of jobwrap runs.)"""
    script = """#!/bin/bash
#SBATCH --output=fifo-%j.out
#JOBWRAP --no-requeue
out="fifo-$SLURM_JOB_ID.out"
echo "about to swap the output"
rm -f "$out" && mkfifo "$out"
exit 1
"""
    job_id, info = _finished_job(cluster, script, "fifo.sh")
    assert info["JobState"] in ("FAILED", "COMPLETED"), info
    _not_drained(cluster)
    archive = cluster.base / "jobwrap" / "archive" / cluster.spec.user / job_id
    assert (archive / "manifest.json").exists(), "the epilog did not archive the job"


def test_a_huge_user_event_file_is_read_from_a_bounded_tail(cluster: Cluster) -> None:
    """Item 3: 300 MB in user-events.jsonl; the epilog reads only its capped tail."""
    job_id, _ = _finished_job(cluster, "#!/bin/bash\ntrue\n", "tiny.sh")
    victim = pwd.getpwnam(cluster.spec.user)
    state = cluster.job_state(job_id)
    state.prepare(victim.pw_uid, victim.pw_gid)  # as the prolog leaves it
    line = json.dumps({"ts": time.time(), "event": "spam", "attempt": 0, "hook": "supervisor"})
    fill = as_user(cluster, cluster.spec.user, [
        "sh", "-c", f"yes '{line}' | head -c 300000000 >> {state.path / USER_EVENTS}"],
        timeout=120)
    assert fill.returncode == 0, fill.stderr
    since = _log_offset(cluster)
    run = run_as_slurmd(cluster, "epilog", slurmd_env(cluster, "epilog", job_id,
                                                      SLURM_JOB_EXIT_CODE2="0:0"))
    assert run.rc == 0, run.stderr
    # A full parse of 300 MB of JSON lines takes gigabytes; the capped tail, megabytes.
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    assert peak_mib < 512, f"the epilog peaked at {peak_mib:.0f} MiB"
    assert _hook_errors(cluster, since, job_id) == []
    _not_drained(cluster)
    # Kept for jobwrap status, then pruned by the age of root's record, which the user
    # cannot touch: eight days on, a later job's epilog drops it.
    assert (state.path / USER_EVENTS).exists()
    week_ago = time.time() - 8 * 86400
    os.utime(state.path / "events.jsonl", (week_ago, week_ago))
    for node in cluster.spec.nodes:
        (cluster.state_of(node) / "jobs" / PRUNE_STAMP).unlink(missing_ok=True)
    _finished_job(cluster, "#!/bin/bash\ntrue\n", "later.sh")
    assert not (state.path / USER_EVENTS).exists(), "the user's file was not pruned"


def test_a_full_state_disk_is_not_a_bug_nor_a_drain(cluster: Cluster) -> None:
    """Item 3: the user fills the file system under the job's state; the next prolog."""
    job_id, _ = _finished_job(cluster, "#!/bin/bash\ntrue\n", "tiny.sh")
    victim = pwd.getpwnam(cluster.spec.user)
    state = cluster.job_state(job_id)
    mounted = False
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0711", "tmpfs",
                        str(state.path)], check=True)
        mounted = True
        state.prepare(victim.pw_uid, victim.pw_gid)
        fill = as_user(cluster, cluster.spec.user, [
            "sh", "-c", f"cat /dev/zero > {state.path / USER_EVENTS}"])
        assert "No space left" in fill.stderr, fill.stderr
        since = _log_offset(cluster)
        run = run_as_slurmd(cluster, "prolog", slurmd_env(cluster, "prolog", job_id))
        assert run.rc == 0, run.stderr
        errors = _hook_errors(cluster, since, job_id)
        assert [e["event"] for e in errors if e["event"] == "hook.bug"] == [], errors
        _not_drained(cluster)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(state.path)], check=False)


def test_a_reused_job_id_of_another_user_does_not_fail_the_new_job(
        cluster: Cluster, rival: UserIds) -> None:
    """Item 3: the state of an earlier job with this id, another user's, is in the way."""
    job_id, _ = _finished_job(cluster, "#!/bin/bash\ntrue\n", "tiny.sh")
    state = cluster.job_state(job_id)
    subprocess.run(["rm", "-rf", "--", str(state.path)], check=True)
    state.prepare(rival.uid, rival.gid)  # the old job was the rival's
    forged = as_user(cluster, rival.name, ["sh", "-c", "echo '{\"event\":\"gpu.fault\"}' >> "
                                           f"{state.path / USER_EVENTS}"])
    assert forged.returncode == 0, forged.stderr
    since = _log_offset(cluster)
    run = run_as_slurmd(cluster, "prolog", slurmd_env(cluster, "prolog", job_id))
    assert run.rc == 0, run.stderr
    assert _hook_errors(cluster, since, job_id) == []
    victim = pwd.getpwnam(cluster.spec.user)
    assert os.lstat(state.path / USER_EVENTS).st_uid == victim.pw_uid
    assert not any(e.get("event") == "gpu.fault" for e in state.events())


def test_a_rival_in_the_same_group_reads_nothing_of_the_jobs_state(
        cluster: Cluster, rival: UserIds) -> None:
    """Item 10: the job's output tail (a password in it) and its state stay private."""
    script = """#!/bin/bash
#SBATCH --output=secret-%j.out
echo "Error: login failed for password=hunter2-$SLURM_JOB_ID"
exit 1
"""
    job_id, _ = _finished_job(cluster, script, "secret.sh")
    job_dir = cluster.job_state(job_id).path
    names = [p.name for p in job_dir.iterdir()]
    assert "events.jsonl" in names
    for name in names:
        seen = as_user(cluster, rival.name, ["cat", str(job_dir / name)])
        assert seen.returncode != 0 and "hunter2" not in seen.stdout, (name, seen.stdout)
    listing = as_user(cluster, rival.name, ["ls", str(job_dir)])
    assert listing.returncode != 0, listing.stdout
    # ... while the job's own user still reads root's record of the job
    own = as_user(cluster, cluster.spec.user, ["cat", str(job_dir / "events.jsonl")])
    assert own.returncode == 0 and "prolog.context" in own.stdout, own.stderr


def test_root_starts_jobwrap_isolated_from_a_planted_cwd(tmp_path: Path) -> None:
    """Item 15: a wrapper/ package and a sitecustomize.py where the hook was started."""
    from wrapper import detach

    marker = tmp_path / "imported"
    planted = tmp_path / "cwd"
    (planted / "wrapper").mkdir(parents=True)
    code = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    (planted / "wrapper" / "__init__.py").write_text(code)
    (planted / "wrapper" / "__main__.py").write_text(code)
    (planted / "sitecustomize.py").write_text(code)
    before = os.getcwd()
    os.chdir(planted)
    try:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(planted)}
        pid = detach.spawn(detach.jobwrap_argv("--help"), env)
    finally:
        os.chdir(before)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not marker.exists(), marker.read_text()
    assert sys.executable


def test_the_job_user_cannot_write_or_grow_the_supervisor_log(cluster: Cluster) -> None:
    """Item 3: supervisor.log sits in root's state folder; the user may read it, not write
    it (a user-writable log there could fill the state disk)."""
    job_id = cluster.submit("#!/bin/bash\nsleep 60\n", name="sleepy.sh")
    log_path = cluster.job_state(job_id).path / "supervisor.log"
    try:
        deadline = time.monotonic() + 60
        while not log_path.exists():  # opened by the supervisor as it starts
            assert time.monotonic() < deadline, "the supervisor opened no log"
            time.sleep(0.5)
        write = as_user(cluster, cluster.spec.user,
                        ["sh", "-c", f"head -c 1000000 /dev/zero >> {log_path}"])
        assert write.returncode != 0 and "Permission denied" in write.stderr, write
        assert log_path.stat().st_size < 1000000 and log_path.stat().st_uid == 0
        read = as_user(cluster, cluster.spec.user, ["head", "-c", "200", str(log_path)])
        assert read.returncode == 0, read.stderr  # the job's own user may read it
    finally:
        subprocess.run(["scancel", job_id], env=cluster.env(), check=False)
        cluster.wait_job(job_id, timeout=60)
