"""Archives unpacked into scratch: every format byte for byte, every trick refused."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.support.staging import MakeDataset, Tmpfs, digest
from wrapper.errors import UserInputError
from wrapper.staging import (
    StageSettings,
    UserIds,
    parse_stage_in,
    prepare_scratch,
    stage_in,
)

SETTINGS = StageSettings(free_margin_bytes=0)
MS = 1_000_000  # a tar keeps mtimes as a decimal number of seconds


@pytest.fixture
def dataset(area: Path, make_dataset: MakeDataset) -> Path:
    return make_dataset(area / "shared" / "ds", big=1 << 20)


@pytest.fixture
def scratch(area: Path, user: UserIds) -> Path:
    return prepare_scratch(area / "scratch", "600", user)


def _tar(dataset: Path, path: Path, mode: str) -> Path:
    with tarfile.open(path, mode) as tar:
        tar.add(dataset, arcname=".")
    return path


def _zip(dataset: Path, path: Path) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for item in sorted(dataset.rglob("*")):
            rel = str(item.relative_to(dataset))
            if item.is_symlink():
                info = zipfile.ZipInfo(rel)
                info.create_system = 3
                info.external_attr = (0o120777 << 16)
                archive.writestr(info, os.readlink(item))
            else:
                archive.write(item, rel)
    return path


def _zst(dataset: Path, path: Path) -> Path:
    plain = _tar(dataset, path.with_suffix(""), "w")
    subprocess.run(["zstd", "-q", "-f", str(plain), "-o", str(path)], check=True)
    return path


MAKERS = {
    "tar": lambda d, p: _tar(d, p / "ds.tar", "w"),
    "tar.gz": lambda d, p: _tar(d, p / "ds.tar.gz", "w:gz"),
    "tar.bz2": lambda d, p: _tar(d, p / "ds.tar.bz2", "w:bz2"),
    "tar.xz": lambda d, p: _tar(d, p / "ds.tar.xz", "w:xz"),
    "tar.zst": lambda d, p: _zst(d, p / "ds.tar.zst"),
    "zip": lambda d, p: _zip(d, p / "ds.zip"),
}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_every_format_unpacks_byte_for_byte(kind: str, dataset: Path, area: Path,
                                            scratch: Path, user: UserIds) -> None:
    archive = MAKERS[kind](dataset, area / "shared")
    report = stage_in([parse_stage_in(f"{archive}:in/ds:unpack")], scratch=scratch, user=user,
                      settings=StageSettings(free_margin_bytes=0, verify="sha256"))
    [item] = report.items
    assert item.unpacked and item.cache_hit is None and item.files == 6
    zip_ = kind == "zip"  # zip keeps local time to 2 s: compare content, modes, links
    assert digest(scratch / "in" / "ds", mtimes=not zip_, resolution_ns=MS) == \
        digest(dataset, mtimes=not zip_, resolution_ns=MS)
    assert len(item.checksums) == 6
    for path in (scratch / "in" / "ds").rglob("*"):
        assert path.lstat().st_uid == user.uid


def _evil_tar(path: Path, members: list[tarfile.TarInfo], data: bytes = b"pwned") -> Path:
    with tarfile.open(path, "w") as tar:
        for member in members:
            if member.isreg():
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
            else:
                tar.addfile(member)
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o644
    return info


@pytest.mark.parametrize(
    ("members", "fragment"),
    [
        ([_member("../evil")], "member '../evil' uses '..' to leave DEST"),
        ([_member("ok/../../evil")], "uses '..'"),
        ([_member("/tmp/evil")], "member '/tmp/evil' is absolute"),
        # a symlink to outside, then a member through it: the classic
        ([_member("link", tarfile.SYMTYPE, "SENTINEL"), _member("link/evil")],
         "'in/link' is in the way"),
        ([_member("dev", tarfile.CHRTYPE)], "member 'dev' is a device or fifo"),
        ([_member("fifo", tarfile.FIFOTYPE)], "is a device or fifo"),
        ([_member("hard", tarfile.LNKTYPE, "SENTINEL/keep.txt")], "uses '..'"),
        ([_member("hard", tarfile.LNKTYPE, "nothing-before")], "not a file unpacked before"),
    ],
)
def test_archive_tricks_are_refused_and_nothing_escapes(
        members: list[tarfile.TarInfo], fragment: str, area: Path, scratch: Path,
        user: UserIds) -> None:
    sentinel = area / "sentinel"
    sentinel.mkdir()
    sentinel.chmod(0o777)  # even a folder the user could write stays untouched
    (sentinel / "keep.txt").write_text("keep")
    relative = os.path.relpath(sentinel, scratch / "in")
    for member in members:
        member.linkname = member.linkname.replace("SENTINEL", relative if member.islnk()
                                                  else str(sentinel))
    archive = _evil_tar(area / "evil.tar", members)
    with pytest.raises(UserInputError) as info:
        stage_in([parse_stage_in(f"{archive}:in:unpack")], scratch=scratch, user=user,
                 settings=SETTINGS)
    assert str(info.value).startswith(f"--stage-in={archive}:in:unpack: ")
    assert fragment in str(info.value)
    assert sorted(os.listdir(sentinel)) == ["keep.txt"]
    assert (sentinel / "keep.txt").read_text() == "keep"
    assert os.listdir(scratch) == []  # what the failed unpack made is gone
    assert not (area / "evil").exists() and not Path("/tmp/evil").exists()


def test_a_folder_cannot_be_unpacked(dataset: Path, scratch: Path, user: UserIds) -> None:
    with pytest.raises(UserInputError, match="only an archive file can be unpacked"):
        stage_in([parse_stage_in(f"{dataset}:in:unpack")], scratch=scratch, user=user)


def test_not_an_archive(dataset: Path, scratch: Path, user: UserIds) -> None:
    with pytest.raises(UserInputError, match=r"is not a tar, .* or zip archive, or it is "
                                             r"damaged"):
        stage_in([parse_stage_in(f"{dataset}/sub/big.bin:in:unpack")], scratch=scratch,
                 user=user, settings=SETTINGS)
    assert os.listdir(scratch) == []


def test_a_truncated_archive(dataset: Path, area: Path, scratch: Path, user: UserIds) -> None:
    archive = _tar(dataset, area / "ds.tar.gz", "w:gz")
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    with pytest.raises(UserInputError, match="damaged"):
        stage_in([parse_stage_in(f"{archive}:in:unpack")], scratch=scratch, user=user,
                 settings=SETTINGS)
    assert os.listdir(scratch) == []


def test_an_archive_too_big_to_unpack_fails_cleanly(area: Path, user: UserIds,
                                                    tmpfs: Tmpfs) -> None:
    shared = area / "shared"
    shared.mkdir()
    (shared / "zeros").write_bytes(b"\0" * (6 << 20))  # compresses to almost nothing
    archive = shared / "zeros.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(shared / "zeros", arcname="zeros")
    assert archive.stat().st_size < 100_000
    with tmpfs(area / "small", "2m") as small:
        scratch = prepare_scratch(small / "scratch", "601", user)
        with pytest.raises(UserInputError) as info:
            stage_in([parse_stage_in(f"{archive}:in:unpack")], scratch=scratch, user=user,
                     settings=SETTINGS)
        assert "the unpacked data does not fit: with 'in/zeros' it needs 6.0 MiB" in \
            str(info.value)
        assert os.listdir(scratch) == []


def test_unpacking_into_scratch_itself_and_hard_links(area: Path, scratch: Path,
                                                      user: UserIds) -> None:
    archive = _evil_tar(area / "ok.tar", [_member("a"), _member("b", tarfile.LNKTYPE, "a"),
                                          _member("./d/", tarfile.DIRTYPE), _member("d/c")])
    stage_in([parse_stage_in(f"{archive}:.:unpack")], scratch=scratch, user=user,
             settings=SETTINGS)
    assert sorted(os.listdir(scratch)) == ["a", "b", "d"]
    assert os.stat(scratch / "a").st_ino == os.stat(scratch / "b").st_ino
    assert (scratch / "d" / "c").read_bytes() == b"pwned"
    assert os.stat(scratch).st_mode & 0o777 == 0o700  # scratch keeps its own mode


def test_a_later_member_replaces_an_earlier_one_but_not_what_was_there(
        area: Path, scratch: Path, user: UserIds) -> None:
    archive = _evil_tar(area / "twice.tar", [_member("x"), _member("x")], b"second")
    stage_in([parse_stage_in(f"{archive}:in:unpack")], scratch=scratch, user=user,
             settings=SETTINGS)
    assert (scratch / "in" / "x").read_bytes() == b"second"
    with pytest.raises(UserInputError, match="'in/x' already exists"):
        stage_in([parse_stage_in(f"{archive}:in:unpack")], scratch=scratch, user=user,
                 settings=SETTINGS)
    assert (scratch / "in" / "x").read_bytes() == b"second"
