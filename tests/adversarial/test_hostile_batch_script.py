"""Issue 12, items 1 and 7: a user's batch script against job_submit.lua (inside
slurmctld, under its locks) and against the root hooks that parse it again.

- A script built to make the plugin's trimming and tokenising quadratic (a long run of
  blanks on a comment line, a multi-MiB hostile header) must be answered at once, and
  another user's ``squeue``/``sbatch`` meanwhile must not wait on it.
- Directive numbers far out of range are refused at submit with a clear message.
- A byte that is not UTF-8 in the script never crashes the hooks: no ``hook.bug``, no
  drain, ``job.json`` written, the job completes.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import threading
import time
from pathlib import Path

from jobwrap_dev.sandbox.cluster import Cluster
from tests.adversarial.conftest import RIVAL, as_user
from wrapper.osl.users import UserIds

PLAIN = "#!/bin/bash\n#SBATCH --time=5\necho plain\n"


def _write_script(cluster: Cluster, name: str, data: bytes, user: str | None = None) -> Path:
    """A script file owned by ``user`` (the test user by default), from raw bytes."""
    entry = pwd.getpwnam(user or cluster.spec.user)
    folder = cluster.work if user is None else Path(entry.pw_dir)
    path = folder / name
    path.write_bytes(data)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    os.chmod(path, 0o700)
    return path


def _sbatch(cluster: Cluster, user: str, path: Path, *args: str,
            timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    res = as_user(cluster, user, ["sbatch", "--parsable", "--hold", f"--chdir={path.parent}",
                                  *args, str(path)], timeout=timeout)
    return res, time.monotonic() - started


def _cancel(cluster: Cluster, *results: subprocess.CompletedProcess[str]) -> None:
    ids = [r.stdout.strip().split(";")[0] for r in results if r.returncode == 0]
    if ids:
        subprocess.run(["scancel", *ids], env=cluster.env(), check=False, timeout=30,
                       capture_output=True)


def _attack_while_others_work(cluster: Cluster, rival: UserIds, hostile: bytes) -> None:
    """Submit ``hostile`` as the test user; meanwhile the rival runs squeue and sbatch."""
    victim = pwd.getpwnam(RIVAL)
    script = _write_script(cluster, "hostile.sh", hostile)
    plain = _write_script(cluster, "plain.sh", PLAIN.encode(), user=victim.pw_name)
    attack: dict[str, tuple[subprocess.CompletedProcess[str], float]] = {}
    thread = threading.Thread(
        target=lambda: attack.setdefault("sbatch", _sbatch(cluster, cluster.spec.user, script)))
    thread.start()
    time.sleep(0.3)  # the hostile job is inside slurmctld's job_submit.lua by now
    started = time.monotonic()
    queue = as_user(cluster, RIVAL, ["squeue", "-h"], timeout=60)
    queue_s = time.monotonic() - started
    other, other_s = _sbatch(cluster, RIVAL, plain)
    thread.join(timeout=120)
    hostile_res, hostile_s = attack["sbatch"]
    _cancel(cluster, hostile_res, other)
    assert rival.uid == victim.pw_uid
    assert queue.returncode == 0, queue.stderr
    assert other.returncode == 0, other.stderr
    assert hostile_res.returncode == 0, hostile_res.stderr  # a valid script: accepted
    assert hostile_s < 2, f"sbatch of the hostile script took {hostile_s:.1f} s"
    assert queue_s < 3, f"another user's squeue waited {queue_s:.1f} s"
    assert other_s < 3, f"another user's sbatch waited {other_s:.1f} s"


def test_run_of_blanks_on_a_comment_line_does_not_stall_slurmctld(
        cluster: Cluster, rival: UserIds) -> None:
    hostile = (b"#!/bin/bash\n#JOBWRAP --max-restarts=1\n#" + b" " * (80 * 1024) + b"x\n"
               b"#JOBWRAP --checkpoint-dir=" + b"c" * (80 * 1024) + b"\necho done\n")
    _attack_while_others_work(cluster, rival, hostile)


def test_multi_mib_hostile_script_does_not_stall_slurmctld(
        cluster: Cluster, rival: UserIds) -> None:
    # Under Slurm's default max_script_size (4 MB): runs of blanks between words, on
    # comment lines and on directive lines, and long quoted words, all in the header.
    line = b"#" + b" \t" * 32768 + b"x\n"
    directive = b"#JOBWRAP --checkpoint-marker='" + b"m" * 65536 + b"'   \t   \n"
    body = (line + directive) * 20
    hostile = b"#!/bin/bash\n" + body + b"#" + b" " * (3 * 1024 * 1024 - len(body)) + b"\n"
    _attack_while_others_work(cluster, rival, hostile + b"echo done\n")


def test_out_of_range_numbers_are_refused_at_submit(cluster: Cluster) -> None:
    cases = [("--max-restarts=" + "9" * 4301, "from 0 to 1000"),
             ("--hang-timeout=" + "9" * 400, "at most 30 days"),
             ("--max-restarts=1001", "from 0 to 1000"),
             ("--hang-timeout=31d", "at most 30 days")]
    for directive, phrase in cases:
        name = directive.split("=")[0].lstrip("-")
        script = _write_script(cluster, f"{name}.sh",
                               f"#!/bin/bash\n#JOBWRAP {directive}\necho no\n".encode())
        res, seconds = _sbatch(cluster, cluster.spec.user, script)
        _cancel(cluster, res)
        assert res.returncode != 0, f"{directive[:40]}... was accepted"
        assert f"#JOBWRAP line 2: {directive.split('=')[0]}" in res.stderr, res.stderr[-500:]
        assert phrase in res.stderr, res.stderr[-500:]
        assert "Traceback" not in res.stderr
        assert seconds < 2


def test_latin1_bytes_in_the_script_never_crash_the_hooks(cluster: Cluster) -> None:
    script = _write_script(cluster, "latin1.sh", (
        b"#!/bin/bash\n# r\xe9sum\xe9 of the run\n"
        b"#JOBWRAP --checkpoint-dir=ckpt-caf\xe9 --checkpoint-marker=DON\xc9\n"
        b"#SBATCH --output=latin1-%j.out\n"
        b"echo caf\xe9 on $SLURMD_NODENAME\n"))
    res = as_user(cluster, cluster.spec.user,
                  ["sbatch", "--parsable", f"--chdir={cluster.work}", str(script)])
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip().split(";")[0]
    info = cluster.wait_job(job_id)
    assert info["JobState"] == "COMPLETED", info
    state = cluster.job_state(job_id)
    record = state.read_json("job.json")
    assert record is not None, "the prolog wrote no job.json"
    assert record["options_error"] == ""
    assert record["options"]["checkpoint_dir"] == "ckpt-caf\udce9"
    events = [e["event"] for e in state.events()]
    assert "epilog.context" in events and "directives.invalid" not in events, events
    log_text = cluster.logs_text()
    bugs = [line for line in log_text.splitlines() if "hook.bug" in line]
    assert bugs == []
    assert (cluster.work / f"latin1-{job_id}.out").read_bytes().startswith(b"caf\xe9 on n")
    states = cluster.node_states()
    assert all(not s.startswith(("drain", "down")) for s in states.values()), states
