"""The manifest's package reader against a hostile Python environment of the job's user.

The epilog (root) lists the packages of the Python the job's environment names. The user
controls that folder: a ``.pth`` that runs code when Python starts, a FIFO in place of a
``METADATA`` (opening it for reading blocks), a ``METADATA`` that links to a root-only
file. None may run, hang the epilog, drain a node, or leak root's file into the archive.
"""

from __future__ import annotations

import json
import os

from wrapper.sandbox.cluster import Cluster

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
