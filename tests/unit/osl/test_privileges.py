from __future__ import annotations

import os
from pathlib import Path

import pytest

from wrapper.osl.child import call_as as as_user
from wrapper.osl.files import append_text_line as append_line
from wrapper.osl.files import read_tail_text as read_tail
from wrapper.osl.users import AsUserError, UserIds


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
    with pytest.raises(AsUserError, match="symbolic links"):  # never followed
        as_user(user, read_tail, str(link))


def test_tail_and_append_on_the_users_file(user: UserIds, shared: Path) -> None:
    out = shared / "job.out"
    out.write_text("x" * 100 + "\nlast line\n")
    os.chown(out, user.uid, user.gid)
    assert as_user(user, read_tail, str(out), 10) == "last line\n"
    assert as_user(user, append_line, str(out), "jobwrap: hello") is True
    assert out.read_text().endswith("last line\njobwrap: hello\n")
    assert as_user(user, append_line, str(shared / "missing.out"), "x") is False
