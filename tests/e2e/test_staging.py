"""Staging on the real cluster: data in before the job, results out after it, the node's
cache, and the safety rules, as the job's user."""

from __future__ import annotations

import hashlib
import os
import pwd
import subprocess
import tarfile
from pathlib import Path

import pytest

from jobwrap_dev.sandbox.cluster import Cluster
from jobwrap_dev.sandbox.daemons import SandboxError


def chown_tree(path: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.lchown(name, entry.pw_uid, entry.pw_gid)


def digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def dataset(cluster: Cluster) -> Path:
    data = cluster.work / "dataset"
    (data / "sub").mkdir(parents=True, exist_ok=True)
    for i in range(50):
        (data / "sub" / f"f{i}.bin").write_bytes(os.urandom(1000 + i))
    (data / "big.bin").write_bytes(os.urandom(3 * 2**20))
    with tarfile.open(cluster.work / "pack.tar", "w") as tar:
        tar.add(data / "sub", arcname="sub")
    chown_tree(data, cluster.spec.user)
    os.lchown(cluster.work / "pack.tar", pwd.getpwnam(cluster.spec.user).pw_uid, -1)
    return data


JOB = """#!/bin/bash
#SBATCH --output={name}-%j.out
#JOBWRAP --stage-in={work}/dataset:data --stage-in={work}/pack.tar:unpacked:unpack
#JOBWRAP --stage-out=results:{work}/results-{name}
set -e
cd "$JOBWRAP_SCRATCH"
mkdir -p results
sha256sum data/big.bin > results/big.sha
ls unpacked/sub | wc -l > results/count
cp -r data/sub results/copy
{extra}
"""


def staged_events(cluster: Cluster, job_id: str, name: str) -> list[dict[str, object]]:
    return [e for e in cluster.events(job_id) if e["event"] == name]


def test_stage_in_read_write_stage_out_then_cache(cluster: Cluster, dataset: Path) -> None:
    work = cluster.work
    job_id = cluster.submit(JOB.format(name="st1", work=work, extra=""), name="st1.sh")
    info = cluster.wait_job(job_id)
    assert info["JobState"] == "COMPLETED", (work / f"st1-{job_id}.out").read_text()
    out = work / "results-st1"
    assert (out / "big.sha").read_text().split()[0] == \
        hashlib.sha256((dataset / "big.bin").read_bytes()).hexdigest()
    assert (out / "count").read_text().strip() == "50"
    assert digest(out / "copy") == digest(dataset / "sub")
    assert out.stat().st_uid == pwd.getpwnam(cluster.spec.user).pw_uid
    [first] = staged_events(cluster, job_id, "staging.in")
    assert first["files"] >= 101
    # scratch was removed after the job
    assert not any(p.exists() for p in cluster.scratch_paths(job_id))
    # the first stage left its cache entry complete but not durable (no syncfs on the
    # start path); the job's epilog made it durable, and the marker says so
    import json

    cache = cluster.node_dir(info["NodeList"]) / "cache"
    markers = [json.loads(m.read_text()) for m in (cache / "entries").glob("*/complete.json")]
    assert markers and all(m["synced"] is True for m in markers), markers
    assert list((cache / "unsynced").iterdir()) == []

    # on the same node, its own cache serves the dataset; on another, that node's own
    # cache has not seen it (each node keeps its cache to itself)
    again = cluster.submit(JOB.format(name="st2", work=work, extra=""), "-w", info["NodeList"],
                           name="st2.sh")
    assert cluster.wait_job(again)["JobState"] == "COMPLETED"
    [second] = staged_events(cluster, again, "staging.in")
    assert second["cache_hits"] >= 1, second
    other = next(n for n in cluster.spec.nodes if n != info["NodeList"])
    elsewhere = cluster.submit(JOB.format(name="st2b", work=work, extra=""), "-w", other,
                               name="st2b.sh")
    assert cluster.wait_job(elsewhere)["JobState"] == "COMPLETED"
    [third] = staged_events(cluster, elsewhere, "staging.in")
    assert third["cache_hits"] == 0, third


def test_failed_job_outputs_are_still_staged_out(cluster: Cluster, dataset: Path) -> None:
    job_id = cluster.submit(JOB.format(name="st3", work=cluster.work,
                                       extra="echo partial > results/partial; exit 4"),
                            "--no-requeue", name="st3.sh")
    assert cluster.wait_job(job_id)["JobState"] == "FAILED"
    assert (cluster.work / "results-st3" / "partial").read_text() == "partial\n"


def test_root_only_source_fails_the_job_not_the_node(cluster: Cluster) -> None:
    secret = cluster.base / "root-only"
    secret.mkdir(exist_ok=True)
    (secret / "s.bin").write_text("secret")
    os.chmod(secret, 0o700)
    job_id = cluster.submit(f"#!/bin/bash\n#SBATCH --output=st4-%j.out\n"
                            f"#JOBWRAP --stage-in={secret}:x\necho should not run\n",
                            name="st4.sh")
    info = cluster.wait_job(job_id)
    assert info["JobState"] == "FAILED"
    output = (cluster.work / f"st4-{job_id}.out").read_text()
    assert "jobwrap: the job did not start:" in output and str(secret) in output, output
    assert "should not run" not in output
    assert not any(p.name == "s.bin" for n in cluster.spec.nodes
                   for p in cluster.scratch_of(n).rglob("*"))
    assert set(cluster.node_states().values()) == {"idle"}
    ends = staged_events(cluster, job_id, "attempt.end")
    assert ends and ends[0]["decision"] == "stop", ends


def test_dest_escape_is_refused_at_submit(cluster: Cluster) -> None:
    with pytest.raises(SandboxError, match=r"\.\."):
        cluster.submit(f"#!/bin/bash\n#JOBWRAP --stage-in={cluster.work}/pack.tar:../../etc\n"
                       "true\n", name="st5.sh")


def test_symlink_to_root_in_scratch_deletes_nothing_outside(cluster: Cluster) -> None:
    sentinel = cluster.base / "sentinel"
    sentinel.mkdir(exist_ok=True)
    (sentinel / "keep").write_text("keep me")
    job_id = cluster.submit(f"#!/bin/bash\nln -s / \"$JOBWRAP_SCRATCH/root\"\n"
                            f"ln -s {sentinel} \"$JOBWRAP_SCRATCH/sentinel\"\n", name="st6.sh")
    assert cluster.wait_job(job_id)["JobState"] == "COMPLETED"
    assert (sentinel / "keep").read_text() == "keep me"
    assert Path("/etc/passwd").exists()
    assert not any(p.exists() for p in cluster.scratch_paths(job_id))
    removed = staged_events(cluster, job_id, "scratch.removed")
    assert removed and all(e["complete"] for e in removed)
    subprocess.run(["true"], check=True)
