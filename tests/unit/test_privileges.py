from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path

import pytest

from wrapper.privileges import AsUserError, UserIds, append_line, as_user, read_tail

USER = "jwtest"


@pytest.fixture(scope="module")
def user() -> UserIds:
    if os.geteuid() != 0:
        pytest.fail("privilege tests run as root (as CI does)")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", USER], check=True)
    entry = pwd.getpwnam(USER)
    return UserIds.of(entry.pw_uid, entry.pw_gid)


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    # the job user must reach the files; pytest's own temp root is private
    os.chmod(tmp_path, 0o755)  # noqa: S103
    for parent in tmp_path.parents:
        if str(parent).startswith("/tmp/pytest-of"):
            os.chmod(parent, 0o755)  # noqa: S103
    return tmp_path


def test_runs_with_the_users_ids(user: UserIds) -> None:
    assert as_user(user, os.getuid) == user.uid
    assert as_user(user, os.getgid) == user.gid


def test_root_only_file_is_refused(user: UserIds, shared: Path) -> None:
    secret = shared / "secret"
    secret.write_text("root only\n")
    os.chmod(secret, 0o600)
    with pytest.raises(AsUserError, match="Permission denied"):
        as_user(user, read_tail, str(secret))


def test_symlink_to_a_root_only_file_is_refused(user: UserIds, shared: Path) -> None:
    secret = shared / "shadowish"
    secret.write_text("root only\n")
    os.chmod(secret, 0o600)
    link = shared / "job.out"
    link.symlink_to(secret)
    with pytest.raises(AsUserError, match="Permission denied"):
        as_user(user, read_tail, str(link))


def test_tail_and_append_on_the_users_file(user: UserIds, shared: Path) -> None:
    out = shared / "job.out"
    out.write_text("x" * 100 + "\nlast line\n")
    os.chown(out, user.uid, user.gid)
    assert as_user(user, read_tail, str(out), 10) == "last line\n"
    assert as_user(user, append_line, str(out), "jobwrap: hello") is True
    assert out.read_text().endswith("last line\njobwrap: hello\n")
    assert as_user(user, append_line, str(shared / "missing.out"), "x") is False
