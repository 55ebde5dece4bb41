"""Every attempt of a job lands in one archive with a manifest that matches the cluster."""

from __future__ import annotations

import gzip
import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

from jobwrap_dev.sandbox.cluster import Cluster

SCRIPT = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --gres=gpu:1
#SBATCH --output=arch-%j.out
#SBATCH --open-mode=append
#JOBWRAP --max-restarts=2
export SEED=7 LOADEDMODULES=cuda/12.4:nccl/2.18 VIRTUAL_ENV=@VENV@
srun bash -c 'echo "hello from $SLURMD_NODENAME attempt $JOBWRAP_ATTEMPT"'
[ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] || { echo "ValueError: first try fails"; exit 3; }
"""


def jobwrap(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(cluster.runtime / "venv" / "bin" / "jobwrap"), "--config",
                           str(cluster.jobwrap_config), *args], capture_output=True, text=True,
                          env=cluster.env(), timeout=60, check=False)


def test_requeued_two_node_job_has_one_archive_with_both_attempts(cluster: Cluster) -> None:
    venv = cluster.runtime / "venv"
    job_id = cluster.submit(SCRIPT.replace("@VENV@", str(venv)), name="arch.sh")
    info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED"}, timeout=120)
    assert info["JobState"] == "COMPLETED", info
    root = cluster.base / "jobwrap" / "archive" / cluster.spec.user / job_id
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["schema_version"] == 1
    assert manifest["job"]["id"] == job_id and manifest["job"]["user"] == cluster.spec.user
    attempts = [(a["attempt"], a["outcome"], a["decision"]) for a in manifest["attempts"]]
    assert attempts == [(0, "user_error", "requeue"), (1, "success", "done")], attempts
    # one part per node of each attempt: any two of the sandbox's nodes (an attempt lands
    # on whichever are idle), the last attempt's being the job's
    parts = sorted((p["attempt"], p["node"]) for p in manifest["archive"]["parts"])
    nodes = {attempt: sorted(n for a, n in parts if a == attempt) for attempt in (0, 1)}
    assert len(parts) == 4 and all(len(set(n)) == 2 for n in nodes.values()), parts
    assert sorted(manifest["job"]["nodes"]) == nodes[1], (manifest["job"], parts)
    assert manifest["archive"]["complete"] is True
    assert manifest["exit"]["final"] is True and manifest["exit"]["outcome"] == "success"

    # the batch host's part holds the job's own output, as it was at that attempt's end
    host = info["BatchHost"]
    first = gzip.decompress((root / "attempt-0" / host / "stdout.gz").read_bytes()).decode()
    assert "ValueError: first try fails" in first
    assert all(f"hello from {node} attempt 0" in first for node in nodes[0]), first
    script = gzip.decompress((root / "attempt-0" / host / "batch-script.sh.gz").read_bytes())
    assert b"#JOBWRAP --max-restarts=2" in script

    # the user and admins only
    for path in (root, root / "manifest.json"):
        mode = os.stat(path).st_mode
        assert not mode & stat.S_IROTH, oct(mode)

    status = jobwrap(cluster, "status", job_id)
    assert status.returncode == 0, status.stderr
    text = status.stdout
    assert text.index("attempt 0") < text.index("attempt 1"), text
    assert "user_error" in text and "requeue" in text and "success" in text
    show = jobwrap(cluster, "archive", "show", job_id, "--json")
    assert json.loads(show.stdout)["job"]["id"] == job_id
    # both nodes' epilogs spooled the job's record; root's commands fold it into the index
    listed = jobwrap(cluster, "archive", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    (entry,) = [i for i in json.loads(listed.stdout) if i["job_id"] == job_id]
    assert entry["attempts"] == [0, 1] and entry["complete"], entry
    index = cluster.base / "jobwrap" / "archive" / ".index" / "archive.sqlite"
    assert stat.S_IMODE(os.stat(index).st_mode) == 0o600
    _check_reproduction(cluster, job_id, manifest, venv, sorted(set(nodes[0] + nodes[1])))


def _check_reproduction(cluster: Cluster, job_id: str, manifest: dict[str, Any],
                        venv: Path, nodes: list[str]) -> None:
    """The manifest says what ran it, where its environment came from, and reruns it."""
    for node in nodes:  # root's version checks, read in the hooks (fake probe)
        stack = manifest["software"][node]
        assert (stack["driver"], stack["cuda"]) == ("550.54.15", "12.4"), stack
    env = manifest["environment"]  # the srun step saw what the script exported
    assert env["source"] == "user" and env["modules"] == ["cuda/12.4", "nccl/2.18"], env
    assert env["venv"] == str(venv) and manifest["seeds"] == {"SEED": "7"}
    python = manifest["python"]
    assert python["kind"] == "venv" and python["error"] == "", python
    assert any(line.startswith("click==") for line in python["pip"]), python["pip"]
    assert any(line.startswith("jobwrap==") for line in python["pip"]), python["pip"]
    command = manifest["rerun"]["command"]
    assert "--nodes=2" in command and "SEED=7" in command, command
    # (--gres=gpu:1 comes back from the script's own #SBATCH line: this Slurm's record
    # carries no TresPerNode nor gres/gpu in ReqTRES)
    printed = jobwrap(cluster, "archive", "show", job_id, "--rerun")
    assert (printed.returncode, printed.stdout) == (0, command + "\n"), printed.stderr
    # the line submits the same job again (held, then cancelled)
    res = cluster.as_user(["bash", "-c", command + " --hold --parsable"], check=False)
    assert res.returncode == 0, res.stderr
    again = res.stdout.strip().split(";")[0]
    try:
        info = cluster.job(again)
        assert info["NumNodes"].split("-")[0] == "2", info
        assert info["WorkDir"] == str(cluster.work)
    finally:
        cluster.as_user(["scancel", again], check=False)


def test_symlinked_output_to_a_root_only_file_is_not_archived(cluster: Cluster) -> None:
    secret = cluster.base / "root-only-secret"
    secret.write_text("TOP SECRET root data\n")
    os.chmod(secret, 0o600)
    link = cluster.work / "leak.out"
    link.unlink(missing_ok=True)
    os.symlink(secret, link)
    os.lchown(link, *(lambda p: (p.pw_uid, p.pw_gid))(__import__("pwd").getpwnam(
        cluster.spec.user)))
    job_id = cluster.submit("#!/bin/bash\n#SBATCH --output=leak.out\n#SBATCH --open-mode="
                            "append\necho hi\n", name="leak.sh")
    info = cluster.wait_job(job_id)
    assert info["JobState"] in ("FAILED", "COMPLETED")
    root = cluster.base / "jobwrap" / "archive" / cluster.spec.user / job_id
    # the job was archived (its events at least), so the loop below reads real parts
    assert (root / "manifest.json").is_file(), sorted(root.rglob("*"))
    parts = sorted(root.glob("attempt-*/*/*.gz"))
    assert any(p.name == "events.jsonl.gz" for p in parts), parts
    for part in parts:
        assert b"TOP SECRET" not in gzip.decompress(part.read_bytes()), part
    assert secret.read_text() == "TOP SECRET root data\n"
