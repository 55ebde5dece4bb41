"""osl.dirs: folders through descriptors, never a symlink, and the one remove_tree."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from wrapper.osl import dirs


def _fd(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def test_a_symlink_in_a_folders_place_is_refused_unless_following_is_asked(
        tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "file").write_text("x")
    parent = _fd(tmp_path)
    try:
        for name in ("link", "file"):
            with pytest.raises(dirs.NotADirectory) as caught:
                dirs.open_dir(name, dir_fd=parent)
            assert isinstance(caught.value, OSError)  # callers that catch OSError still do
            assert caught.value.errno in (errno.ELOOP, errno.ENOTDIR)
            assert caught.value.filename == name
        os.close(dirs.open_dir(tmp_path / "link", follow=True))
    finally:
        os.close(parent)


def test_make_dir_makes_or_reuses_and_never_follows(tmp_path: Path) -> None:
    parent = _fd(tmp_path)
    try:
        os.close(dirs.make_dir(parent, "new", 0o750))
        assert (tmp_path / "new").stat().st_mode & 0o777 == 0o750 & ~_umask()
        os.close(dirs.make_dir(parent, "new", 0o700))  # there already: reused as it is
        (tmp_path / "away").mkdir()
        (tmp_path / "swapped").symlink_to(tmp_path / "away")
        with pytest.raises(dirs.NotADirectory):
            dirs.make_dir(parent, "swapped")
    finally:
        os.close(parent)


def test_remove_tree_unlinks_a_symlink_and_keeps_what_it_points_to(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "precious").write_text("x")
    tree = tmp_path / "tree" / "a"
    tree.mkdir(parents=True)
    (tree / "f").write_text("y")
    (tree / "out").symlink_to(kept)
    parent = _fd(tmp_path)
    try:
        removal = dirs.remove_tree(parent, "tree", display="the tree")
        assert (removal.path, removal.files, removal.dirs, removal.complete) == \
            ("the tree", 2, 2, True)
        assert not (tmp_path / "tree").exists() and (kept / "precious").exists()
        assert not dirs.remove_tree(parent, "tree").existed
        (tmp_path / "link").symlink_to(kept)  # a symlink in the tree's own place
        assert dirs.remove_tree(parent, "link").files == 1
        assert (kept / "precious").exists()
    finally:
        os.close(parent)


def test_sizes_and_entries_read_through_descriptors(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x" * 10)
    (tmp_path / "g").write_bytes(b"y" * 5)
    (tmp_path / "l").symlink_to("/etc/passwd")
    fd = _fd(tmp_path)
    try:
        assert dirs.tree_size(fd) == 15  # the symlink's target is not counted
        assert sorted(e.name for e in dirs.entries(fd)) == ["d", "g", "l"]
        assert dirs.exists(fd, "l") and not dirs.exists(fd, "nothing")
        assert dirs.first_missing(fd, "d/x/y") == "d/x"
        dirs.sync_tree(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
