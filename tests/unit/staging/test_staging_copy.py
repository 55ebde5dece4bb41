"""Stage-in without the cache: the copy engine, run by a worker with the user's rights."""

from __future__ import annotations

import errno
import hashlib
import os
import re
from pathlib import Path

import pytest

from tests.support.staging import HOSTILE, MakeDataset, Tmpfs, digest
from wrapper.errors import UserInputError
from wrapper.staging import (
    Progress,
    StageSettings,
    StagingError,
    UserIds,
    parse_stage_in,
    prepare_scratch,
    stage_in,
)
from wrapper.staging import copy as engine
from wrapper.staging.tree import Entry, SourceTree

NO_MARGIN = StageSettings(free_margin_bytes=0)


@pytest.fixture
def scratch(area: Path, user: UserIds) -> Path:
    return prepare_scratch(area / "scratch", "100", user)


def test_a_tree_is_staged_byte_for_byte_and_owned_by_the_user(
        dataset: Path, scratch: Path, user: UserIds) -> None:
    updates: list[Progress] = []
    report = stage_in([parse_stage_in(f"{dataset}:data/in")], scratch=scratch, user=user,
                      settings=StageSettings(free_margin_bytes=0, progress_interval=0),
                      progress=updates.append)
    staged = scratch / "data" / "in"
    assert digest(staged) == digest(dataset)  # content, links, modes and mtimes
    [item] = report.items
    assert (item.files, item.bytes) == (6, sum(f.stat().st_size for f in dataset.rglob("*")
                                               if f.is_file() and not f.is_symlink()))
    assert item.cache_hit is None and item.source == str(dataset) and item.dest == "data/in"
    for path in [scratch / "data", *staged.rglob("*")]:
        info = path.lstat()
        assert (info.st_uid, info.st_gid) == (user.uid, user.gid), path
    assert updates[-1].done and updates[-1].bytes_done == item.bytes
    assert updates[-1].files_done == updates[-1].files_total == 6
    assert [u.bytes_done for u in updates] == sorted(u.bytes_done for u in updates)
    assert updates[-1].rate > 0


def test_a_single_file_takes_its_name(dataset: Path, scratch: Path, user: UserIds) -> None:
    report = stage_in([parse_stage_in(str(dataset / "sub" / "big.bin"))], scratch=scratch,
                      user=user, settings=NO_MARGIN)
    assert (scratch / "big.bin").read_bytes() == (dataset / "sub" / "big.bin").read_bytes()
    assert report.items[0].dest == "big.bin"


def test_relative_sources_are_read_from_the_work_dir(dataset: Path, scratch: Path,
                                                     user: UserIds) -> None:
    stage_in([parse_stage_in("ds/a.txt:a")], scratch=scratch, user=user, settings=NO_MARGIN,
             work_dir=str(dataset.parent))
    assert (scratch / "a").read_text() == "hello\n"
    with pytest.raises(UserInputError, match="relative and the job's working directory"):
        stage_in([parse_stage_in("ds/a.txt:b")], scratch=scratch, user=user,
                 settings=NO_MARGIN)


def test_sha256_verification_reports_the_checksums(dataset: Path, scratch: Path,
                                                   user: UserIds) -> None:
    report = stage_in([parse_stage_in(f"{dataset}:d")], scratch=scratch, user=user,
                      settings=StageSettings(verify="sha256", free_margin_bytes=0))
    sums = report.items[0].checksums
    assert sums["d/sub/big.bin"] == hashlib.sha256(
        (dataset / "sub" / "big.bin").read_bytes()).hexdigest()
    assert len(sums) == 6


def test_a_file_only_root_can_read_is_refused_and_nothing_is_copied(
        area: Path, scratch: Path, user: UserIds) -> None:
    secret = area / "shared" / "root-only.bin"
    secret.parent.mkdir(exist_ok=True)
    secret.write_bytes(b"root's secret")
    secret.chmod(0o600)
    with pytest.raises(UserInputError) as info:
        stage_in([parse_stage_in(f"{secret}:s")], scratch=scratch, user=user,
                 settings=NO_MARGIN)
    assert str(info.value).startswith(f"--stage-in={secret}:s: SRC")
    assert "cannot be read by the job's user (permission denied)" in str(info.value)
    assert os.listdir(scratch) == []


def test_a_tree_with_one_unreadable_file_leaves_nothing_behind(
        dataset: Path, scratch: Path, user: UserIds) -> None:
    (dataset / "sub" / "deep" / "empty").chmod(0o600)
    with pytest.raises(UserInputError, match="cannot be read by the job's user"):
        stage_in([parse_stage_in(f"{dataset}:data/in")], scratch=scratch, user=user,
                 settings=NO_MARGIN)
    assert os.listdir(scratch) == []  # what it had made (data/, data/in/...) is gone


def test_a_missing_source(area: Path, scratch: Path, user: UserIds) -> None:
    with pytest.raises(UserInputError, match="does not exist on this node"):
        stage_in([parse_stage_in(f"{area}/nope:x")], scratch=scratch, user=user)


def test_a_fifo_is_refused_without_being_opened(dataset: Path, scratch: Path,
                                               user: UserIds) -> None:
    os.mkfifo(dataset / "sub" / "pipe")  # opening it would block forever
    with pytest.raises(UserInputError, match="'sub/pipe' is a fifo"):
        stage_in([parse_stage_in(f"{dataset}:d")], scratch=scratch, user=user,
                 settings=NO_MARGIN, timeout=60)


def test_a_symlink_planted_in_scratch_does_not_redirect_the_copy(
        dataset: Path, area: Path, scratch: Path, user: UserIds) -> None:
    elsewhere = area / "elsewhere"
    elsewhere.mkdir()
    elsewhere.chmod(0o777)  # even where the user could write, nothing lands through a link
    os.symlink(elsewhere, scratch / "data")
    with pytest.raises(UserInputError, match="'data' is in the way"):
        stage_in([parse_stage_in(f"{dataset}:data/in")], scratch=scratch, user=user,
                 settings=NO_MARGIN)
    assert os.listdir(elsewhere) == []


def test_two_directives_to_one_place(dataset: Path, scratch: Path, user: UserIds) -> None:
    with pytest.raises(UserInputError, match="'x' already exists"):
        stage_in([parse_stage_in(f"{dataset}/a.txt:x"), parse_stage_in(f"{dataset}/run.sh:x")],
                 scratch=scratch, user=user, settings=NO_MARGIN)


def test_a_file_cannot_be_staged_onto_scratch_itself(dataset: Path, scratch: Path,
                                                     user: UserIds) -> None:
    with pytest.raises(UserInputError, match="a file needs a name"):
        stage_in([parse_stage_in(f"{dataset}/a.txt:.")], scratch=scratch, user=user)


def test_a_folder_can_be_merged_into_scratch(dataset: Path, scratch: Path,
                                             user: UserIds) -> None:
    stage_in([parse_stage_in(f"{dataset}:.")], scratch=scratch, user=user, settings=NO_MARGIN)
    assert (scratch / "sub" / "big.bin").stat().st_size == (dataset / "sub" /
                                                            "big.bin").stat().st_size
    info = os.stat(scratch)
    assert (info.st_mode & 0o777, info.st_uid) == (0o700, user.uid)  # scratch keeps its own


def test_a_dataset_too_big_for_the_disk_fails_before_copying(
        area: Path, dataset: Path, user: UserIds, tmpfs: Tmpfs) -> None:
    with tmpfs(area / "small", "2m") as small:
        scratch = prepare_scratch(small / "scratch", "101", user)
        with pytest.raises(UserInputError) as info:
            stage_in([parse_stage_in(f"{dataset}:data")], scratch=scratch, user=user,
                     settings=NO_MARGIN)
        message = str(info.value)
        assert message.startswith(f"--stage-in={dataset}:data: ")
        assert re.search(r"needs 3\.\d MiB but only 2\.0 MiB is free on the node's local "
                         r"disk; stage less data", message)
        assert "ask for a node with more local disk" in message
        assert os.listdir(scratch) == []


def test_the_margin_is_kept_free(area: Path, dataset: Path, user: UserIds, tmpfs: Tmpfs) -> None:
    with tmpfs(area / "small", "8m") as small:
        scratch = prepare_scratch(small / "scratch", "102", user)
        with pytest.raises(UserInputError, match=r"and 6\.0 MiB must stay free"):
            stage_in([parse_stage_in(f"{dataset}:data")], scratch=scratch, user=user,
                     settings=StageSettings(free_margin_bytes=6 << 20))
        stage_in([parse_stage_in(f"{dataset}:data")], scratch=scratch, user=user,
                 settings=StageSettings(free_margin_bytes=1 << 20))
        assert (scratch / "data" / "sub" / "big.bin").exists()


def test_out_of_time(dataset: Path, scratch: Path, user: UserIds) -> None:
    with pytest.raises(StagingError, match="ran out of its time budget"):
        stage_in([parse_stage_in(f"{dataset}:d")], scratch=scratch, user=user, timeout=1e-6)


def test_a_scratch_that_is_not_the_users_is_refused(dataset: Path, area: Path,
                                                    user: UserIds) -> None:
    (area / "not-theirs").mkdir()
    with pytest.raises(StagingError, match="not to the job's user"):
        stage_in([parse_stage_in(f"{dataset}:d")], scratch=area / "not-theirs", user=user)


# -- the engine's own pieces ---------------------------------------------------------------


def _entry(path: Path) -> Entry:
    info = path.stat()
    return Entry("", "file", info.st_size, 0o644, info.st_mtime_ns, info.st_ctime_ns)


@pytest.mark.parametrize("broken", [(), ("copy_file_range",),
                                    ("copy_file_range", "sendfile")])
def test_every_copy_path_gives_the_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              broken: tuple[str, ...]) -> None:
    """copy_file_range, else sendfile, else buffered reads: all byte-for-byte."""
    for name in broken:
        def unsupported(*args: object, **kwargs: object) -> int:
            raise OSError(errno.EXDEV, "pretend another file system")
        monkeypatch.setattr(engine.os, name, unsupported)
    source = tmp_path / "src.bin"
    source.write_bytes(os.urandom((9 << 20) + 7))
    seen: list[int] = []
    fd = os.open(source, os.O_RDONLY)
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        copied = engine.write_file(fd, _entry(source), dir_fd, "dst.bin", label="dst.bin",
                                   mode=0o640, verify="sha256", on_bytes=seen.append)
    finally:
        os.close(fd)
        os.close(dir_fd)
    data = source.read_bytes()
    assert (tmp_path / "dst.bin").read_bytes() == data
    assert copied.sha256 == hashlib.sha256(data).hexdigest()
    assert sum(seen) == len(data)
    assert (tmp_path / "dst.bin").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "dst.bin").stat().st_mtime_ns == source.stat().st_mtime_ns


def test_a_source_that_changed_since_the_scan_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "src.bin"
    source.write_bytes(b"12345")
    stale = _entry(source)
    source.write_bytes(b"123456")
    fd = os.open(source, os.O_RDONLY)
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(UserInputError, match="changed while it was being staged"):
            engine.write_file(fd, stale, dir_fd, "dst", label="dst", mode=0o644,
                              verify="size")
    finally:
        os.close(fd)
        os.close(dir_fd)
    assert not (tmp_path / "dst").exists()


def test_small_files_are_grouped_by_folder_and_large_ones_alone() -> None:
    entries = [Entry(f"{d}/f{i}", "file", 10) for d in "ab" for i in range(3)]
    entries += [Entry("a/huge", "file", engine.LARGE), Entry("b/huge", "file", engine.LARGE)]
    seen: list[list[str]] = []

    def work(entry: Entry) -> None:
        seen.append([entry.path])

    engine.for_each_by_folder(entries, lambda e: e.path.split("/")[0], work, parallel=1)
    order = [s[0] for s in seen]
    assert order[:2] == ["a/huge", "b/huge"]  # largest tasks first
    assert order[2:5] == ["a/f0", "a/f1", "a/f2"]  # a folder's files together, in order
    failures = engine.for_each_by_folder(
        entries, lambda e: e.path.split("/")[0],
        lambda e: (_ for _ in ()).throw(OSError(errno.EIO, "boom")) if "f1" in e.path
        else None, parallel=4, keep_going=True)
    assert sorted(e.path for e, _ in failures) == ["a/f1", "b/f1"]


def test_a_file_rewritten_with_its_old_mtime_is_still_noticed(tmp_path: Path) -> None:
    """A user can set an mtime back; the ctime moves anyway, and the copy checks it."""
    source = tmp_path / "src.bin"
    source.write_bytes(b"original")
    with SourceTree(str(source)) as tree:
        [entry] = tree.manifest.entries
        source.write_bytes(b"poisoned")  # same size
        os.utime(source, ns=(entry.mtime_ns, entry.mtime_ns))
        fd = tree.open(entry)
        dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with pytest.raises(UserInputError, match="changed while it was being staged"):
                engine.write_file(fd, entry, dir_fd, "dst", label="dst", mode=0o644,
                                  verify="size")
        finally:
            os.close(fd)
            os.close(dir_fd)
    assert not (tmp_path / "dst").exists()


def test_a_folder_swapped_for_a_symlink_after_the_scan_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "ds" / "sub").mkdir(parents=True)
    (tmp_path / "ds" / "sub" / "f").write_text("real")
    (tmp_path / "decoy").mkdir()
    (tmp_path / "decoy" / "f").write_text("fake")
    with SourceTree(str(tmp_path / "ds")) as tree:
        entry = next(e for e in tree.manifest.entries if e.path == "sub/f")
        os.rename(tmp_path / "ds" / "sub", tmp_path / "moved")
        os.symlink(tmp_path / "decoy", tmp_path / "ds" / "sub")
        with pytest.raises(UserInputError, match="folder 'sub' changed while it was being "
                                                 "staged"):
            tree.open(entry)


@pytest.mark.parametrize("mode", [0o644, 0o666, 0o600, 0o444, 0o755])
def test_a_copy_gets_the_mode_asked_for_whatever_the_umask(tmp_path: Path, mode: int) -> None:
    """Files are made with their final mode (no chmod when the umask leaves it whole);
    a umask that takes bits away is undone by a chmod, never left in place."""
    source = tmp_path / "src.bin"
    source.write_bytes(b"x" * 100)
    entry = _entry(source)
    old = os.umask(0o077)
    fd = os.open(source, os.O_RDONLY)
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        engine.write_file(fd, entry, dir_fd, "dst", label="dst", mode=mode, verify="size")
    finally:
        os.umask(old)
        os.close(fd)
        os.close(dir_fd)
    info = (tmp_path / "dst").stat()
    assert (info.st_mode & 0o7777, info.st_size) == (mode, 100)
    assert info.st_mtime_ns == entry.mtime_ns


def test_sync_filesystem_syncs_one_file_system_and_reports_errors(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"data")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        engine.sync_filesystem(fd)  # the whole file system, in one call
    finally:
        os.close(fd)
    with pytest.raises(OSError) as caught:
        engine.sync_filesystem(fd)  # closed: the kernel's error comes back, not silence
    assert caught.value.errno == errno.EBADF


def test_descriptor_batches_hold_one_folder_each() -> None:
    from wrapper.staging.worker import BATCH, folder_batches

    files = [Entry(f"a/{i}", "file") for i in range(BATCH + 5)] + [
        Entry("b/x", "file"), Entry("top", "file"), Entry("c/d/y", "file")]
    batches = [[e.path for e in b] for b in folder_batches(files)]
    assert [len(b) for b in batches] == [BATCH, 5, 1, 1, 1]
    assert batches[2:] == [["b/x"], ["top"], ["c/d/y"]]
    assert list(folder_batches([])) == []


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_copy_batches_copies_by_folder_and_closes_every_descriptor(tmp_path: Path) -> None:
    source = tmp_path / "src"
    for d in "ab":
        (source / d).mkdir(parents=True)
        for i in range(30):
            (source / d / f"{i:02d}").write_bytes(os.urandom(i * 100))
    before = _open_fds()
    with SourceTree(str(source)) as src:
        files = src.manifest.files
        out = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        (tmp_path / "out").mkdir()
        tree = engine.DirTree(out)
        for d in ("out/a", "out/b"):
            tree.get(d)
        result = engine.TreeResult()
        seen: list[str] = []
        batches = [[(e, src.open(e)) for e in files[i:i + 7]] for i in range(0, len(files), 7)]
        engine.copy_batches(batches, tree, "out", result, verify="sha256", parallel=4,
                            then=lambda e, c: seen.append(e.path), backlog=10)
        tree.close()
        os.close(out)
    assert (result.files, sorted(seen)) == (60, sorted(e.path for e in files))
    assert digest(tmp_path / "out", modes=False, mtimes=False) == digest(source, modes=False,
                                                                         mtimes=False)
    # a folder's files are copied in order, by one thread at a time
    assert [p for p in seen if p.startswith("a/")] == [f"a/{i:02d}" for i in range(30)]
    assert _open_fds() == before


def test_copy_batches_stops_at_the_first_failure_and_closes_the_rest(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for i in range(40):
        (source / f"{i:02d}").write_bytes(b"x" * i)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "05").write_bytes(b"in the way")
    before = _open_fds()
    with SourceTree(str(source)) as src:
        out = os.open(tmp_path / "out", os.O_RDONLY | os.O_DIRECTORY)
        tree = engine.DirTree(out)
        batches = [[(e, src.open(e))] for e in src.manifest.files]
        with pytest.raises(UserInputError, match="already exists"):
            engine.copy_batches(iter(batches), tree, "", engine.TreeResult(), verify="size",
                                parallel=2)
        tree.close()
        os.close(out)
    assert _open_fds() == before


def test_a_proven_scan_hands_out_the_descriptors_it_read(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in "abc":
        (source / name).write_text(name)
    monkeypatch.setattr(SourceTree, "KEEP_OPEN", 2)  # and no more than that
    before = _open_fds()
    with SourceTree(str(source), prove_read=True) as src:
        a = next(e for e in src.manifest.files if e.path == "a")
        scanned = (source / "a").stat().st_ino
        (source / "a").rename(source / "a.old")  # replaced after the scan
        (source / "a").write_text("not what was scanned")
        fd = src.open(a)
        try:
            assert os.fstat(fd).st_ino == scanned  # the very file the scan read
        finally:
            os.close(fd)
        assert len(_open_fds() - before) == 2  # the root, and one kept still
    assert _open_fds() == before


def test_the_dataset_helper_covers_every_kind(tmp_path: Path, make_dataset: MakeDataset) -> None:
    """The dataset holds each kind the tests rely on (so a broken helper fails here)."""
    tree = digest(make_dataset(tmp_path / "ds", big=1024))
    kinds = {row[0] for row in tree.values()}
    assert kinds == {"file", "dir", "link"}
    assert f"sub/{HOSTILE}" in tree
    assert tree["run.sh"][2] == "0o755"


def test_a_listing_that_calls_a_fifo_a_file_is_proved_wrong_on_open(
        dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan opens what the folder's listing calls a file (no lstat before): a FIFO put
    in its place, or a listing that lies, is opened without blocking, found no file by
    fstat, and refused as the scan refuses a FIFO; nothing of it is kept."""
    from wrapper.staging.tree import SourceTree

    os.mkfifo(dataset / "sub" / "pipe")
    listed = SourceTree._names

    def every_name_a_file(self: SourceTree, fd: int, rel: str) -> list[tuple[str, bool]]:
        return [(name, True) for name, _regular in listed(self, fd, rel)]

    monkeypatch.setattr(SourceTree, "_names", every_name_a_file)
    with pytest.raises(UserInputError, match="'sub/pipe' is a fifo"), \
            SourceTree(str(dataset), prove_read=True):
        pass
    os.unlink(dataset / "sub" / "pipe")  # without it, every listed file is proved and kept
    with SourceTree(str(dataset), prove_read=True) as tree:
        files = {e.path: e.size for e in tree.manifest.entries if e.kind == "file"}
    on_disk = {str(p.relative_to(dataset)): p.stat().st_size for p in dataset.rglob("*")
               if p.is_file() and not p.is_symlink()}
    assert files and files == on_disk, files

