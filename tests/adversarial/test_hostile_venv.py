"""The manifest's package reader against a hostile Python environment of the job's user.

The epilog (root) lists the packages of the Python the job's environment names. The user
controls that folder: a ``.pth`` that runs code when Python starts, a FIFO in place of a
``METADATA`` (opening it for reading blocks), a ``METADATA`` that links to a root-only
file. None may run, hang the epilog, drain a node, or leak root's file into the archive.
"""

from __future__ import annotations

import json
import os
import subprocess

from jobwrap_dev.sandbox.cluster import Cluster

SCRIPT = """#!/bin/bash
#SBATCH --output=evilenv-%j.out
set -e
env=$PWD/evilenv-$SLURM_JOB_ID
site=$env/lib/python3.11/site-packages
mkdir -p $site/good-1.0.dist-info $site/hang-1.0.dist-info $site/leak-2.0.dist-info
printf 'Name: good\\nVersion: 1.0\\n' > $site/good-1.0.dist-info/METADATA
mkfifo $site/hang-1.0.dist-info/METADATA
ln -s @SECRET@ $site/leak-2.0.dist-info/METADATA
echo "import os; open('$env/pth-ran', 'w').close()" > $site/evil.pth
export VIRTUAL_ENV=$env
srun true
echo done
"""


def test_a_hostile_venv_neither_runs_nor_hangs_nor_leaks_in_the_epilog(
        cluster: Cluster) -> None:
    secret = cluster.base / "rerun-root-secret"
    secret.write_text("Name: LEAKED\nVersion: 6.6.6\n")
    os.chmod(secret, 0o600)
    job_id = cluster.submit(SCRIPT.replace("@SECRET@", str(secret)), name="evilenv.sh")
    info = cluster.wait_job(job_id, timeout=120)
    assert info["JobState"] == "COMPLETED", info
    states = cluster.node_states()
    assert not any("drain" in s for s in states.values()), states
    root = cluster.base / "jobwrap" / "archive" / cluster.spec.user / job_id
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["archive"]["complete"] is True, manifest["archive"]
    python = manifest["python"]
    assert python["error"] == "", python
    assert python["pip"] == ["good==1.0", "hang==1.0", "leak==2.0"], python
    text = (root / "manifest.json").read_text()
    assert "LEAKED" not in text and "6.6.6" not in text
    assert not (cluster.work / f"evilenv-{job_id}" / "pth-ran").exists()


FORGED_CONTEXT = """#!/bin/bash
#SBATCH --output=forgectx-%j.out
cat {forged} >> {state}/jobs/$SLURM_JOB_ID/user-events.jsonl
sleep 2
echo done
"""
FORGED_RECORD = {"ts": 4.0e9, "event": "task-prolog.context", "attempt": 0, "node": "n1",
                 "hook": "task-prolog", "step": "batch",
                 "environment": {"modules": ["a"], "venv": "/v", "evil": "<@here>",
                                 "seeds": {"SEED": "7", "BASH_ENV": "/home/u/.cache/x.sh",
                                           "LD_PRELOAD": "/tmp/evil.so",
                                           "X_SEED": "1;touch /tmp/p"}}}


def test_a_forged_task_prolog_context_exports_nothing_into_the_rerun_line(
        cluster: Cluster) -> None:
    """Issue 22, item 4: the seeds of a forged task-prolog.context became the rerun
    line's --export (BASH_ENV, LD_PRELOAD): an admin rerunning the job ran the user's
    code. The manifest keeps only claims filtered as at the source."""
    forged = cluster.write_user_file("forgectx.json", json.dumps(FORGED_RECORD) + "\n")
    job_id = cluster.submit(FORGED_CONTEXT.format(state=cluster.state_in_script, forged=forged),
                            name="forgectx.sh")
    info = cluster.wait_job(job_id, timeout=120)
    assert info["JobState"] == "COMPLETED", info
    root = cluster.base / "jobwrap" / "archive" / cluster.spec.user / job_id
    manifest = json.loads((root / "manifest.json").read_text())
    seen = [a["environment"] for a in manifest["attempts"]
            if (a.get("environment") or {}).get("modules") == ["a"]]
    assert seen, manifest["attempts"]  # the forged record was read, and filtered
    assert seen[-1]["seeds"] == {"SEED": "7"}, seen
    assert "evil" not in seen[-1]
    env = {**cluster.env(), "JOBWRAP_CONFIG": str(cluster.jobwrap_config)}
    shown = subprocess.run([str(cluster.runtime / "venv" / "bin" / "jobwrap"), "archive",
                            "show", job_id, "--rerun"], env=env, capture_output=True,
                           text=True, timeout=60, check=False)
    assert shown.returncode == 0, shown.stderr
    assert "SEED=7" in shown.stdout, shown.stdout
    for bad in ("BASH_ENV", "LD_PRELOAD", "evil.so", "touch"):
        assert bad not in shown.stdout, shown.stdout
