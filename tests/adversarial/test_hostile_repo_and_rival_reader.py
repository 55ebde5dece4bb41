"""Attacks on the archive and the node cache, played by an ordinary user (issue 12: items
5, 9, 11, 13)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path

from jobwrap_dev.sandbox.cluster import Cluster
from wrapper.osl.users import UserIds

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x", "GIT_CONFIG_NOSYSTEM": "1"}


def as_user(cluster: Cluster, user: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``argv`` run by ``user`` (conftest's ``as_user`` looks runuser up in a PATH without
    /usr/sbin, where Debian keeps it)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "SLURM_CONF": str(cluster.conf),
           "HOME": pwd.getpwnam(user).pw_dir, "LANG": "C.UTF-8"}
    return subprocess.run([shutil.which("runuser") or "/usr/sbin/runuser", "-u", user, "--",
                           *argv], env=env, cwd="/", capture_output=True, text=True,
                          timeout=30, check=False)


def _git(cluster: Cluster, repo: Path, *args: str) -> None:
    res = as_user(cluster, cluster.spec.user,
                  ["env", *(f"{k}={v}" for k, v in GIT_ENV.items()), "git", "-C", str(repo),
                   *args])
    assert res.returncode == 0, res.stderr


def _archive(cluster: Cluster, job_id: str) -> Path:
    return cluster.base / "jobwrap" / "archive" / cluster.spec.user / job_id


def _wait_manifest(cluster: Cluster, job_id: str, timeout: float = 60) -> dict[str, object]:
    path = _archive(cluster, job_id) / "manifest.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            manifest: dict[str, object] = json.loads(path.read_text())
            if (manifest.get("exit") or {}).get("final"):  # type: ignore[union-attr]
                return manifest
        time.sleep(0.3)
    raise AssertionError(f"no final manifest at {path} after {timeout:g} s")


def _processes_running(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry.name))
    return found


# -- item 5: the manifest runs no code of the user's -----------------------------------------
def test_the_epilog_runs_no_fsmonitor_filter_or_hook_of_the_users_repository(
        cluster: Cluster) -> None:
    user = pwd.getpwnam(cluster.spec.user)
    repo = cluster.work / "evil-repo"
    repo.mkdir()
    os.chown(repo, user.pw_uid, user.pw_gid)
    _git(cluster, repo, "init", "-q", "-b", "main")
    (repo / "train.py").write_text("print(1)\n")
    os.chown(repo / "train.py", user.pw_uid, user.pw_gid)
    _git(cluster, repo, "add", "train.py")
    _git(cluster, repo, "commit", "-q", "-m", "first")
    commit = as_user(cluster, cluster.spec.user,
                     ["git", "-C", str(repo), "rev-parse", "HEAD"]).stdout.strip()
    # Only now the traps: every program git could start on the epilog's behalf writes the
    # marker and then lingers, to outlive the job.
    marker = cluster.work / "evil-ran"
    evil = repo / "evil-jobwrap-program.sh"
    evil.write_text(f"#!/bin/sh\necho \"$0 $*\" >> {marker}\nsleep 40\ncat\n")
    os.chown(evil, user.pw_uid, user.pw_gid)
    os.chmod(evil, 0o700)
    hooks = repo / ".git" / "hooks"
    for name in ("post-index-change", "reference-transaction", "fsmonitor-watchman"):
        (hooks / name).write_text(evil.read_text())
        os.chown(hooks / name, user.pw_uid, user.pw_gid)
        os.chmod(hooks / name, 0o700)
    _git(cluster, repo, "config", "core.fsmonitor", str(evil))
    _git(cluster, repo, "config", "filter.evil.clean", str(evil))
    _git(cluster, repo, "config", "filter.evil.smudge", str(evil))
    _git(cluster, repo, "config", "filter.evil.process", str(evil))
    (repo / ".gitattributes").write_text("* filter=evil\n")
    os.chown(repo / ".gitattributes", user.pw_uid, user.pw_gid)
    time.sleep(1.1)
    (repo / "train.py").write_text("print(2)\n")  # stat data differs: status would clean it

    script = "#!/bin/bash\necho working\n"
    path = cluster.write_user_file("gitjob.sh", script, 0o755)
    res = cluster.as_user(["sbatch", "--parsable", f"--chdir={repo}", str(path)])
    job_id = res.stdout.strip().split(";")[0]
    info = cluster.wait_job(job_id, timeout=120)
    assert info["JobState"] == "COMPLETED", info
    manifest = _wait_manifest(cluster, job_id)
    assert not marker.exists(), marker.read_text()
    assert not _processes_running("evil-jobwrap-program"), "the user's program outlived the job"
    code = manifest["code"]
    assert isinstance(code, dict), manifest
    assert code["repository"] is True and code["commit"] == commit, code
    assert code["branch"] == "main", code
    assert code["dirty"] is True, code  # train.py changed, seen without running git
    assert not any("DRAIN" in s.upper() for s in cluster.node_states().values())


# -- item 11: a user sharing the primary group reads no one else's archive -----------------
def test_a_rival_in_the_same_primary_group_cannot_read_the_archive(cluster: Cluster,
                                                                  rival: UserIds) -> None:
    job_id = cluster.submit("#!/bin/bash\necho 'the secret is hunter2'\n", name="secret.sh")
    info = cluster.wait_job(job_id, timeout=120)
    assert info["JobState"] == "COMPLETED", info
    _wait_manifest(cluster, job_id)
    root = _archive(cluster, job_id)
    stdout = next(root.glob("attempt-0/*/stdout.gz"))
    for path in (root / "manifest.json", stdout):
        peek = as_user(cluster, rival.name, ["cat", str(path)])
        assert peek.returncode != 0 and not peek.stdout, f"{rival.name} read {path}"
    listing = as_user(cluster, rival.name, ["ls", str(root)])
    assert listing.returncode != 0 and not listing.stdout, listing.stdout
    # the job's own user still reads it
    own = as_user(cluster, cluster.spec.user, ["zcat", str(stdout)])
    assert own.returncode == 0 and "hunter2" in own.stdout, own.stderr
