"""Git facts read from .git itself, and the proof that nothing of the repository runs."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from wrapper.archive.gitfacts import GitReadError, read_facts
from wrapper.archive.manifest import read_code
from wrapper.osl.child import call_as as as_user
from wrapper.osl.users import UserIds

ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@x", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
       "PATH": os.environ["PATH"], "HOME": "/nonexistent"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], env=ENV, check=True,
                          capture_output=True, text=True).stdout.strip()


def make_repo(path: Path, *files: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    for name in files or ("a.txt",):
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(f"{name}\n")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "one")
    return path


def test_commit_and_branch_from_loose_and_packed_refs(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", "a.txt", "sub/b.txt")
    head = git(repo, "rev-parse", "HEAD")
    facts = read_facts(str(repo / "sub"))  # a folder inside the work tree finds it too
    assert facts == {"repository": True, "commit": head, "branch": "main", "dirty": False,
                     "changes": 0}
    git(repo, "pack-refs", "--all")
    assert not (repo / ".git" / "refs" / "heads" / "main").exists()
    assert read_facts(str(repo))["commit"] == head
    git(repo, "checkout", "-q", "--detach")
    assert (read_facts(str(repo))["commit"], read_facts(str(repo))["branch"]) == (head, None)


def test_no_repository_and_an_unborn_branch(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert read_facts(str(plain)) == {"repository": False}
    git(plain, "init", "-q", "-b", "dev")
    assert read_facts(str(plain)) == {"repository": True, "commit": None, "branch": "dev"}
    with pytest.raises(FileNotFoundError):
        read_facts(str(tmp_path / "missing"))


def test_a_linked_worktree_reads_its_own_head_and_the_shared_refs(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    git(repo, "worktree", "add", "-q", "-b", "feature", str(tmp_path / "wt"))
    (tmp_path / "wt" / "a.txt").write_text("changed\n")
    git(tmp_path / "wt", "commit", "-q", "-am", "two")
    facts = read_facts(str(tmp_path / "wt"))
    assert facts["branch"] == "feature"
    assert facts["commit"] == git(tmp_path / "wt", "rev-parse", "HEAD")
    assert facts["commit"] != git(repo, "rev-parse", "HEAD")
    assert facts["dirty"] is False


@pytest.mark.parametrize("version", ["2", "3", "4"])
def test_changes_agree_with_git_status(tmp_path: Path, version: str) -> None:
    repo = make_repo(tmp_path / "r", "a.txt", "deep/er/b.txt", "c.sh", "keep.txt")
    git(repo, "update-index", f"--index-version={version}")
    if version == "3":
        git(repo, "update-index", "--skip-worktree", "keep.txt")  # extended flags
    time.sleep(0.01)
    assert read_facts(str(repo))["changes"] == 0
    (repo / "a.txt").write_text("other text\n")
    (repo / "deep" / "er" / "b.txt").unlink()
    os.chmod(repo / "c.sh", 0o744)
    (repo / "untracked.txt").write_text("new\n")  # not counted: only tracked files
    facts = read_facts(str(repo))
    assert (facts["dirty"], facts["changes"]) == (True, 3), facts
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "two")
    assert read_facts(str(repo))["changes"] == 0


def test_hostile_files_in_git_are_refused_not_waited_on(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    (repo / ".git" / "HEAD").unlink()
    os.mkfifo(repo / ".git" / "HEAD")
    with pytest.raises(GitReadError, match="not a regular file"):
        read_facts(str(repo))
    (repo / ".git" / "HEAD").unlink()
    (repo / ".git" / "HEAD").write_text("ref: ../../../etc/passwd\n")
    with pytest.raises(GitReadError, match="not a ref"):
        read_facts(str(repo))
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (repo / ".git" / "index").write_bytes(b"DIRC\0\0\0\2\0\0\0\5garbage")
    with pytest.raises(GitReadError, match="truncated or damaged"):
        read_facts(str(repo))


def test_nothing_of_the_repository_runs(user: UserIds, work: Path) -> None:
    repo = work / "evil"
    marker = repo.parent / "ran"  # the user's own folder: written, were anything run

    def setup() -> None:
        make_repo(repo, "train.py")
        evil = repo / "evil.sh"
        evil.write_text(f"#!/bin/sh\necho ran >> {marker}\ncat\n")
        evil.chmod(0o700)
        git(repo, "config", "core.fsmonitor", str(evil))
        git(repo, "config", "filter.evil.clean", str(evil))
        git(repo, "config", "filter.evil.process", str(evil))
        (repo / ".gitattributes").write_text("* filter=evil\n")
        hook = repo / ".git" / "hooks" / "post-index-change"
        hook.write_text(evil.read_text())
        hook.chmod(0o700)
        time.sleep(0.01)
        (repo / "train.py").write_text("print(2)\n")

    as_user(user, setup)
    facts = read_code(user, str(repo), 10)
    assert facts["error"] == "" and facts["branch"] == "main" and len(facts["commit"]) == 40
    assert (facts["dirty"], facts["changes"]) == (True, 1)
    assert not marker.exists()
