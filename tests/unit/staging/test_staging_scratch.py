"""Per-job scratch: made for the user, refused when something odd is in its place, and
removed without root ever being steered outside it."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.support.staging import Tmpfs
from wrapper.staging import StagingError, UserIds, prepare_scratch, remove_scratch
from wrapper.staging.scratch import remove_tree


@pytest.fixture
def sentinel(area: Path) -> Path:
    """Something outside scratch that must survive every removal: a folder with files."""
    folder = area / "sentinel"
    (folder / "inner").mkdir(parents=True)
    (folder / "keep.txt").write_text("keep me\n")
    (folder / "inner" / "keep2.txt").write_text("me too\n")
    return folder


def sentinel_intact(folder: Path) -> bool:
    return (folder / "keep.txt").read_text() == "keep me\n" and \
        (folder / "inner" / "keep2.txt").read_text() == "me too\n"


def test_scratch_is_the_users_and_private(area: Path, user: UserIds) -> None:
    path = prepare_scratch(area / "scratch", "123", user)
    assert path == area / "scratch" / "123"
    info = os.lstat(path)
    assert (info.st_uid, info.st_gid) == (user.uid, user.gid)
    assert stat.S_IMODE(info.st_mode) == 0o700
    root = os.lstat(area / "scratch")
    assert (root.st_uid, stat.S_IMODE(root.st_mode)) == (0, 0o711)


def test_a_symlink_in_place_of_scratch_is_refused(area: Path, user: UserIds,
                                                  sentinel: Path) -> None:
    (area / "scratch").mkdir(mode=0o711)
    os.symlink(sentinel, area / "scratch" / "7")
    with pytest.raises(StagingError, match="is a symlink; refusing"):
        prepare_scratch(area / "scratch", "7", user)
    assert sentinel_intact(sentinel)
    assert os.stat(sentinel).st_uid == 0  # not handed to the user either


def test_someone_elses_folder_is_refused(area: Path, user: UserIds) -> None:
    (area / "scratch" / "8").mkdir(parents=True)
    os.chown(area / "scratch" / "8", user.uid + 1, user.gid)
    (area / "scratch").chmod(0o711)
    with pytest.raises(StagingError, match="not a scratch folder of this job"):
        prepare_scratch(area / "scratch", "8", user)


def test_a_leftover_of_an_earlier_attempt_is_cleared(area: Path, user: UserIds) -> None:
    path = prepare_scratch(area / "scratch", "9", user)
    (path / "old.ckpt").write_text("stale")
    os.chown(path / "old.ckpt", user.uid, user.gid)
    again = prepare_scratch(area / "scratch", "9", user)
    assert again == path and os.listdir(path) == []
    assert os.stat(path).st_uid == user.uid


@pytest.mark.parametrize("job_id", ["../etc", "1/2", "", "x"])
def test_bad_job_ids(area: Path, user: UserIds, job_id: str) -> None:
    with pytest.raises(StagingError, match="not a job id"):
        prepare_scratch(area / "scratch", job_id, user)


def test_a_scratch_root_others_can_write_is_refused(area: Path, user: UserIds) -> None:
    (area / "scratch").mkdir()
    (area / "scratch").chmod(0o1777)
    with pytest.raises(StagingError, match="writable by it alone"):
        prepare_scratch(area / "scratch", "10", user)


def test_planted_symlinks_do_not_make_root_delete_outside(area: Path, user: UserIds,
                                                         sentinel: Path) -> None:
    """The attack of the issue: ``ln -s / x`` in scratch (here ``/`` is a sentinel folder,
    so a failure costs a folder, not the machine) and its variations."""
    path = prepare_scratch(area / "scratch", "11", user)
    secret = sentinel / "keep.txt"
    os.symlink(sentinel, path / "x")  # ln -s <sentinel> x
    os.symlink(str(sentinel) + "/", path / "x-slash")
    (path / "sub" / "deeper").mkdir(parents=True)
    os.symlink(sentinel / "inner", path / "sub" / "deeper" / "in")
    os.symlink(secret, path / "sub" / "file-link")
    os.symlink("../../..", path / "sub" / "up")
    os.link(secret, path / "sub" / "hard-link")  # a hard link: unlinking it keeps the data
    (path / "sub" / "deeper" / "data").write_bytes(b"\0" * 4096)
    for folder in (path, path / "sub", path / "sub" / "deeper"):
        os.chown(folder, user.uid, user.gid)
    removal = remove_scratch(path)
    assert not os.path.lexists(path)
    assert removal.complete and removal.existed
    assert removal.files == 7 and removal.dirs == 3
    assert sentinel_intact(sentinel)
    assert os.stat(secret).st_nlink == 1
    assert sorted(os.listdir(sentinel)) == ["inner", "keep.txt"]


def test_scratch_itself_swapped_for_a_symlink(area: Path, user: UserIds,
                                              sentinel: Path) -> None:
    (area / "scratch").mkdir(mode=0o711)
    os.symlink(sentinel, area / "scratch" / "12")
    removal = remove_scratch(area / "scratch" / "12")
    assert not os.path.lexists(area / "scratch" / "12")
    assert removal.files == 1 and removal.dirs == 0
    assert sentinel_intact(sentinel)


def test_a_mount_inside_scratch_is_left_alone(area: Path, user: UserIds, tmpfs: Tmpfs) -> None:
    path = prepare_scratch(area / "scratch", "13", user)
    (path / "a" / "mnt").mkdir(parents=True)
    (path / "a" / "file").write_text("goes")
    with tmpfs(path / "a" / "mnt", "1m") as mount:
        (mount / "on-the-mount").write_text("stays")
        removal = remove_scratch(path)
        assert removal.left == ["a/mnt"]
        assert not removal.complete
        assert (mount / "on-the-mount").read_text() == "stays"
        assert not (path / "a" / "file").exists()
    removal = remove_scratch(path)  # unmounted: now it all goes
    assert removal.complete and not os.path.lexists(path)


def test_a_bind_mount_of_the_same_file_system_is_left_alone(area: Path, user: UserIds,
                                                            sentinel: Path) -> None:
    """st_dev cannot tell a bind mount of the same file system; mountinfo can."""
    path = prepare_scratch(area / "scratch", "14", user)
    (path / "bind").mkdir()
    done = subprocess.run(["mount", "--bind", str(sentinel), str(path / "bind")],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.fail(f"this test needs mount --bind (as root): {done.stderr.strip()}")
    try:
        removal = remove_scratch(path)
        assert removal.left == ["bind"]
        assert sentinel_intact(sentinel)
    finally:
        subprocess.run(["umount", "-l", str(path / "bind")], check=False)
    assert remove_scratch(path).complete


def test_a_very_deep_tree_is_removed(area: Path) -> None:
    fd = os.open(area, os.O_RDONLY | os.O_DIRECTORY)
    top = fd
    try:
        for _ in range(2000):  # deeper than Python's recursion limit
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            if fd != top:
                os.close(fd)
            fd = child
        os.close(os.open("leaf", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    finally:
        if fd != top:
            os.close(fd)
    removal = remove_tree(top, "d")
    os.close(top)
    assert (removal.dirs, removal.files) == (2000, 1)
    assert not (area / "d").exists()


def test_removing_what_is_not_there(area: Path) -> None:
    removal = remove_scratch(area / "scratch" / "999")
    assert not removal.existed and removal.complete
