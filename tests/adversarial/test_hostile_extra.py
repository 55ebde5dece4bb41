"""The job's Extra field is the user's: on Slurm 23.02+ every node's prolog reads
job_submit.lua's directives there (SLURM_JOB_EXTRA) instead of asking slurmctld for the
script, and the user can rewrite it (``scontrol update JobId=.. Extra=..``, or submit
with ``--extra``). Played here: smuggled directives past the script's bounds, broken
encodings, a flood of lines, another user's folder to stage in. What an admin relies on:
the prolog parses Extra with the script's rules and bounds, says what is wrong in the
job's record, never a traceback, never a drain, and Extra sets nothing but the job's own
options.
"""

from __future__ import annotations

import json
import pwd
import time

import pytest

from jobwrap_dev.sandbox.cluster import Cluster
from tests.adversarial.conftest import run_as_slurmd, slurmd_env
from wrapper.job.record import load
from wrapper.job.store import JobStore

SCRIPT = """#!/bin/bash
#SBATCH --output=extra-%j.out
#JOBWRAP --max-restarts=2
echo ran
"""
TAG = "jobwrap:1 "


def _log_offset(cluster: Cluster) -> dict[str, int]:
    return cluster.log_marks()


def _log_since(cluster: Cluster, since: dict[str, int], job_id: str) -> list[dict[str, object]]:
    lines = cluster.log_since(since)
    found = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if str(record.get("job_id")) == job_id:
            found.append(record)
    return found


def _not_drained(cluster: Cluster) -> None:
    states = cluster.node_states()
    assert not any("drain" in s for s in states.values()), states


def _finished(cluster: Cluster) -> str:
    job_id = cluster.submit(SCRIPT, name="extra.sh")
    cluster.wait_job(job_id, states={"COMPLETED", "FAILED"}, timeout=100)
    return job_id


def _prolog_with_extra(cluster: Cluster, job_id: str, extra: str) -> tuple[int, str, list[
        dict[str, object]]]:
    """The installed prolog, run as slurmd 23.02+ runs it: the job's times, work dir,
    output pattern and Extra in its environment (nothing to ask slurmctld for)."""
    now = int(time.time())
    env = slurmd_env(cluster, "prolog", job_id, SLURM_JOB_EXTRA=extra,
                     SLURM_JOB_START_TIME=str(now), SLURM_JOB_END_TIME=str(now + 600),
                     SLURM_JOB_WORK_DIR=str(cluster.work),
                     SLURM_JOB_STDOUT=str(cluster.work / "extra-%j.out"))
    since = _log_offset(cluster)
    run = run_as_slurmd(cluster, "prolog", env)
    return run.rc, run.stderr, _log_since(cluster, since, job_id)


HOSTILE = {
    # past the bounds the script has (0..1000 restarts, 30 days)
    "over-bounds": (TAG + "#JOBWRAP --max-restarts=99999999999999999999%0A"
                    "#JOBWRAP --hang-timeout=9999999d", "max-restarts"),
    # broken %-encoding, NUL, invalid UTF-8, a lone quote
    "bad-bytes": (TAG + "%ZZ%%%FF%00%C3%28#JOBWRAP --checkpoint-dir='%00x%", None),
    # a flood: far more than job_submit.lua ever writes (4 KiB), 4000 lines (an
    # environment variable holds at most 128 KiB)
    "flood": (TAG + "%0A".join(["#JOBWRAP --max-restarts=1"] * 4_000), None),
    # an option that is no directive at all
    "unknown-option": (TAG + "#JOBWRAP --run-as=root --max-restarts=1", "run-as"),
    # root's folder to stage in: read with the user's rights, so refused, not copied
    "stage-root": (TAG + "#JOBWRAP --stage-in=/root:stolen", None),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_extra_is_the_users_input_with_the_scripts_bounds(cluster: Cluster,
                                                                  case: str) -> None:
    extra, named = HOSTILE[case]
    job_id = _finished(cluster)
    rc, stderr, logged = _prolog_with_extra(cluster, job_id, extra)
    assert rc == 0, stderr[-2000:]  # non-zero would drain the node
    assert "Traceback" not in stderr, stderr[-2000:]
    bugs = [e for e in logged if e.get("event") in ("hook.bug", "hook.failed")]
    assert bugs == [], bugs
    _not_drained(cluster)
    record = load(cluster.job_state(job_id))
    if named is not None:  # refused, saying which option, and not applied
        assert named in record.options_error, record.options_error
        assert record.options.get("max_restarts") in (None, 2)
    assert not any(p.exists() for p in cluster.scratch_paths(f"{job_id}/stolen"))


def test_extra_sets_only_the_jobs_own_options(cluster: Cluster) -> None:
    """A well-formed rewrite: what the user's script could have said, and no more."""
    job_id = _finished(cluster)
    rc, stderr, _ = _prolog_with_extra(cluster, job_id,
                                       TAG + "#JOBWRAP --max-restarts=7 --hang-timeout=1h")
    assert rc == 0, stderr[-2000:]
    record = load(cluster.job_state(job_id))
    assert record.options_error == ""
    assert record.options["max_restarts"] == 7
    assert (record.user, record.uid) == (cluster.spec.user,
                                         pwd.getpwnam(cluster.spec.user).pw_uid)


def test_the_user_rewrites_extra_with_scontrol_update(cluster: Cluster) -> None:
    """The real path: the job's user rewrites Extra of their pending job, then lets it
    run. 23.02+: its prologs read the rewrite (bounded, refused, no drain). 22.05 has no
    job Extra: Slurm refuses the update and the prolog reads the script."""
    job_id = cluster.submit(SCRIPT, "--hold", name="extra.sh")
    hostile = TAG + "#JOBWRAP --max-restarts=5000%0A#JOBWRAP --hang-timeout=-1"
    update = cluster.as_user(["scontrol", "update", f"jobid={job_id}", f"extra={hostile}"],
                             check=False)
    if cluster.spec.slurm_prefix:
        assert update.returncode == 0, update.stderr
        assert cluster.job(job_id).get("Extra") == hostile
    else:
        assert update.returncode != 0
    since = _log_offset(cluster)
    cluster.as_user(["scontrol", "release", job_id])
    info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED"}, timeout=100)
    logged = _log_since(cluster, since, job_id)
    assert [e for e in logged if e.get("event") in ("hook.bug", "hook.failed")] == []
    _not_drained(cluster)
    record = load(cluster.job_state(job_id))
    if cluster.spec.slurm_prefix:
        assert "max-restarts" in record.options_error, record.options_error
        assert any(e.get("event") == "prolog.bad_directives" for e in logged), logged
    else:
        assert record.options_error == "" and record.options["max_restarts"] == 2
    assert info["JobState"] in ("COMPLETED", "FAILED")
    # the archive keeps the job's real script, never the user's Extra in its place
    assert JobStore(cluster.job_state(job_id)).script() in (None, SCRIPT)


LIMITED = """#!/bin/bash
#SBATCH --output=limited-%j.out
#JOBWRAP --max-restarts=5
echo "ValueError: bad input"
exit 1
"""


def test_the_sites_restart_limit_holds_after_submit(cluster: Cluster) -> None:
    """Issue 37 item 2: the site's ``[restart] max_restarts_limit`` was enforced only by
    job_submit.lua. A job asking more than the limit got past it (a lua installed before
    the limit was set; on 23.02+ the user rewrites Extra after submit, here to 9), and
    root's epilog requeued it as often as the job said. Root's side now holds it to the
    site's config: one restart, then a stop that names the limit."""
    original = cluster.jobwrap_config.read_text()
    assert "[restart]" not in original
    limited = original + "\n[restart]\nmax_restarts_limit = 1\n"
    tmp = cluster.jobwrap_config.with_name("jobwrap.toml.tmp")
    tmp.write_text(limited)
    tmp.chmod(0o644)
    tmp.replace(cluster.jobwrap_config)
    try:
        job_id = cluster.submit(LIMITED, "--hold", name="limited.sh")
        asked = "5"
        if cluster.spec.slurm_prefix:  # 23.02+: the user's own rewrite of its directives
            asked = "9"
            cluster.as_user(["scontrol", "update", f"jobid={job_id}",
                             f"extra={TAG}#JOBWRAP --max-restarts={asked}"])
        cluster.as_user(["scontrol", "release", job_id])
        info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED"}, timeout=150)
    finally:
        tmp.write_text(original)
        tmp.chmod(0o644)
        tmp.replace(cluster.jobwrap_config)
    record = load(cluster.job_state(job_id))
    assert record.options["max_restarts"] == int(asked)  # what the job said, kept as said
    ends = [(e["attempt"], e["decision"], e["reason"])
            for e in cluster.events(job_id, root_only=True)
            if e["event"] == "attempt.end"]
    assert [(a, d) for a, d, _ in ends] == [(0, "requeue"), (1, "stop")], ends
    assert (f"restart limit reached (1 of --max-restarts=1; the job asked for {asked}, "
            "this cluster allows at most 1)") in str(ends[1][2]), ends
    assert info["JobState"] == "FAILED" and info["Restarts"] == "1", info
    _not_drained(cluster)
