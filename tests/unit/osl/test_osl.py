"""The OS-safety layer: the run-as-user engine and the safe file primitives."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from wrapper.osl import files
from wrapper.osl.child import AsUserTimeout, call_as
from wrapper.osl.users import AsUserError, UserIds


def test_a_child_past_its_deadline_is_killed_and_reaped(user: UserIds) -> None:
    started = time.monotonic()
    with pytest.raises(AsUserTimeout, match="did not finish in time"):
        call_as(user, time.sleep, 60, timeout=0.5)
    assert time.monotonic() - started < 30
    with pytest.raises(ChildProcessError):  # nothing left to reap: no zombie
        os.waitpid(-1, os.WNOHANG)


def test_the_alarm_ends_the_child_before_its_deadline(user: UserIds) -> None:
    started = time.monotonic()
    with pytest.raises(AsUserError, match=f"died \\(killed by signal {int(signal.SIGALRM)}\\)"):
        call_as(user, time.sleep, 60, alarm=0.3, timeout=50)
    assert time.monotonic() - started < 30  # the alarm, not the parent's deadline
    with pytest.raises(ChildProcessError):  # reaped: no zombie
        os.waitpid(-1, os.WNOHANG)
    assert call_as(user, lambda: "in time", alarm=30) == "in time"


def test_the_alarmed_child_has_the_users_rights_only(user: UserIds, shared: Path) -> None:
    secret = shared / "root-only"
    secret.write_text("root's\n")
    os.chmod(secret, 0o600)
    assert call_as(user, os.getuid, alarm=30) == user.uid
    with pytest.raises(AsUserError, match="Permission denied"):
        call_as(user, secret.read_text, alarm=30)
    mine = shared / "users"
    mine.write_text("the user's\n")
    os.chown(mine, user.uid, user.gid)
    os.chmod(mine, 0o600)
    assert call_as(user, mine.read_text, alarm=30) == "the user's\n"


def test_in_process_no_alarm_is_armed() -> None:
    """Already the user (root here), ``fn`` runs in this process: an alarm would end it."""
    me = UserIds.of(os.geteuid(), os.getegid())
    before = signal.getitimer(signal.ITIMER_REAL)  # pytest-timeout's, if it runs
    during = call_as(me, signal.getitimer, signal.ITIMER_REAL, alarm=0.01)
    assert during[0] == before[0] == 0.0 or before[0] - 5 < during[0] <= before[0]


def test_a_result_past_its_bound_is_refused(user: UserIds) -> None:
    with pytest.raises(AsUserError, match="more than 1000 bytes"):
        call_as(user, lambda: "x" * 100_000, max_result=1000)


def test_the_child_keeps_only_the_descriptors_it_is_given(user: UserIds, tmp_path: Path) -> None:
    fd = os.open(tmp_path / "root-log", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        open_fds = call_as(user, lambda: sorted(int(n) for n in os.listdir("/proc/self/fd")))
    finally:
        os.close(fd)
    assert fd not in open_fds
    assert call_as(user, os.getuid) == user.uid


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    with pytest.raises(files.NotRegularFile, match="FIFO"):
        files.read_tail(fifo, 100)
    with pytest.raises(files.NotRegularFile, match="character device"):
        files.read_tail("/dev/zero", 100)


def test_a_symlink_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("keep\n")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(OSError, match="symbolic links"):
        files.read_tail(link, 100)
    with pytest.raises(OSError, match="symbolic links"):
        files.append_line(link, b"x")
    assert target.read_text() == "keep\n"


def test_the_tail_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(b"a" * 10_000 + b"end\n")
    assert files.read_tail(path, 4) == b"end\n"
    assert files.read_tail_text(tmp_path / "missing") == ""


def test_atomic_write_sets_the_mode_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "record.json"
    path.write_text("old")
    files.atomic_write(path, b"new", mode=0o640)
    assert path.read_text() == "new"
    assert path.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_append_is_capped(tmp_path: Path) -> None:
    path = tmp_path / "events"
    assert files.append_line(path, b"x") == "missing"
    assert files.append_line(path, b"12345", create_mode=0o600, cap=10) == "ok"
    assert files.append_line(path, b"12345", cap=10) == "full"
    assert path.read_bytes() == b"12345\n"


def test_private_mkdir_refuses_a_symlink_and_another_owner(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "d").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(files.UnsafeFileError, match="not a directory"):
        files.private_mkdir(tmp_path / "d", 0o711)
    info = files.private_mkdir(tmp_path / "mine", 0o711)
    assert info.st_mode & 0o777 == 0o711
    os.chown(tmp_path / "mine", 4242, 4242)
    with pytest.raises(files.WrongOwner, match="uid 4242"):
        files.private_mkdir(tmp_path / "mine", 0o711)


def test_only_its_owner_may_write_what_root_trusts(tmp_path: Path) -> None:
    folder = tmp_path / "root-owned"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    assert files.owned_alone(folder.stat())
    assert not files.owned_alone(folder.stat(), uid=os.geteuid() + 1)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        files.require_owned_alone(fd, "the folder")
        for mode in (0o775, 0o1777):  # the group's, everyone's (a sticky bit changes nothing)
            folder.chmod(mode)
            assert not files.owned_alone(folder.stat())
            with pytest.raises(files.UnsafeFileError,
                               match=f"the folder must be owned by uid {os.geteuid()} and "
                                     f"writable by it alone \\(it is uid {os.geteuid()}, "
                                     f"mode {mode:04o}\\)"):
                files.require_owned_alone(fd, "the folder")
    finally:
        os.close(fd)


def test_a_private_folder_is_one_nobody_else_may_even_read(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    folder.chmod(0o700)
    assert files.owned_alone(folder.stat(), private=True)
    assert not files.owned_alone(folder.stat(), uid=os.geteuid() + 1, private=True)
    for mode in (0o750, 0o701):  # readable or enterable by others: not private
        folder.chmod(mode)
        assert files.owned_alone(folder.stat())
        assert not files.owned_alone(folder.stat(), private=True)


def test_chown_never_follows_a_swapped_in_symlink(tmp_path: Path) -> None:
    """Item 14: a user swaps a symlink for the file root is about to hand them."""
    target = tmp_path / "shadow"
    target.write_text("root's\n")
    os.chmod(target, 0o600)
    swapped = tmp_path / "user-file"
    swapped.symlink_to(target)
    with pytest.raises(files.UnsafeFileError, match="symlink"):
        files.chown_nofollow(swapped, 4242, 4242)
    assert (target.stat().st_uid, target.stat().st_gid) == (0, 0)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(files.NotRegularFile):
        files.chown_nofollow(fifo, 4242)
    real = tmp_path / "real"
    real.write_text("")
    files.chown_nofollow(real, 4242, 4242)
    assert real.stat().st_uid == 4242


def test_grant_read_lets_only_that_user_read(user: UserIds, shared: Path) -> None:
    path = shared / "events.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"secret\n")
        granted = files.grant_read(fd, user.uid)
    finally:
        os.close(fd)
    assert granted, "the test file system must support POSIX ACLs"
    assert call_as(user, files.read_tail_text, str(path)) == "secret\n"
    with pytest.raises(AsUserError, match="Permission denied"):
        call_as(UserIds.of(65534), files.read_tail_text, str(path))
