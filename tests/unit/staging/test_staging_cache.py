"""The node cache: one copy per dataset per node, shared safely between jobs."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import stat
import subprocess
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.staging import (
    SETTINGS,
    Jobs,
    MakeDataset,
    Tmpfs,
    as_user,
    digest,
    try_write,
)
from wrapper.config import StagingConfig
from wrapper.errors import UserInputError
from wrapper.staging import (
    Cache,
    StageItem,
    StageSettings,
    StagingError,
    UserIds,
    parse_stage_in,
    prepare_scratch,
    stage_in,
)
from wrapper.staging.tree import SourceTree

MIB = 1 << 20
MS = 1_000_000  # what a tar keeps of an mtime, safely


@pytest.fixture
def cache(area: Path) -> Cache:
    return Cache(area / "cache", max_bytes=64 * MIB)


def test_the_second_job_is_served_from_the_cache(jobs: Jobs, dataset: Path, cache: Cache,
                                                 user: UserIds) -> None:
    first, miss = jobs.stage(f"{dataset}:data", cache)
    second, hit = jobs.stage(f"{dataset}:data", cache)
    assert (miss.cache_hit, hit.cache_hit) == (False, True)
    expected = digest(dataset, modes=False)
    assert digest(first / "data", modes=False) == expected
    assert digest(second / "data", modes=False) == expected
    assert (hit.files, hit.bytes) == (miss.files, miss.bytes) == (6, miss.bytes)
    [entry] = cache.entries()
    assert entry.complete and entry.bytes == miss.bytes and entry.source == str(dataset)
    big = os.stat(second / "data" / "sub" / "big.bin")
    assert big.st_ino == os.stat(first / "data" / "sub" / "big.bin").st_ino  # one copy
    assert big.st_nlink == 3  # the cache's and two jobs'
    assert (big.st_uid, stat.S_IMODE(big.st_mode)) == (0, 0o444)
    assert stat.S_IMODE(os.stat(second / "data" / "run.sh").st_mode) == 0o555
    folder = os.stat(second / "data" / "sub")  # folders are the user's, with the source's mode
    assert (folder.st_uid, stat.S_IMODE(folder.st_mode)) == (user.uid, 0o755)


def test_the_job_cannot_change_the_cache_through_its_link(jobs: Jobs, dataset: Path,
                                                          cache: Cache, user: UserIds) -> None:
    scratch, _ = jobs.stage(f"{dataset}:data", cache)
    linked = scratch / "data" / "sub" / "big.bin"
    before = hashlib.sha256(linked.read_bytes()).hexdigest()
    tried = as_user(user, lambda: try_write(linked))
    assert tried == {"write": "PermissionError", "chmod": "PermissionError",
                     "truncate": "PermissionError"}
    assert hashlib.sha256(linked.read_bytes()).hexdigest() == before
    # and the cache itself is out of the user's reach
    assert as_user(user, lambda: _listing(cache.root)) == {"error": "PermissionError"}
    info = os.stat(cache.root)
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o700)
    # unlinking its own link is the job's right, and leaves the cache whole
    assert as_user(user, lambda: _unlink(linked)) == {"ok": True}
    _, again = jobs.stage(f"{dataset}:data", cache)
    assert again.cache_hit is True


def _listing(path: Path) -> dict[str, Any]:
    try:
        return {"names": os.listdir(path)}
    except OSError as exc:
        return {"error": type(exc).__name__}


def _unlink(path: Path) -> dict[str, Any]:
    os.unlink(path)
    return {"ok": True}


def _stage_in_process(area: str, dataset: str, job: str, barrier: Any, out: Any) -> None:
    user = UserIds.lookup("jwtest")
    cache = Cache(Path(area) / "cache", max_bytes=256 * MIB)
    scratch = prepare_scratch(Path(area) / "scratch", job, user)
    barrier.wait(30)
    report = stage_in([parse_stage_in(f"{dataset}:data")], scratch=scratch, user=user,
                      cache=cache, settings=SETTINGS, timeout=120)
    out.put(report.items[0].as_dict())


def test_two_jobs_staging_the_same_dataset_at_once_copy_it_once(
        area: Path, user: UserIds, make_dataset: MakeDataset) -> None:
    dataset = make_dataset(area / "shared" / "ds", big=24 * MIB)  # a fill takes a while
    context = multiprocessing.get_context("fork")
    barrier, out = context.Barrier(3), context.Queue()
    procs = [context.Process(target=_stage_in_process,
                             args=(str(area), str(dataset), str(300 + i), barrier, out))
             for i in range(3)]
    for proc in procs:
        proc.start()
    items = [out.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    assert sorted(i["cache_hit"] for i in items) == [False, True, True]
    cache = Cache(area / "cache", max_bytes=256 * MIB)
    assert len(cache.entries()) == 1
    for job in ("300", "301", "302"):
        assert digest(area / "scratch" / job / "data", modes=False) == digest(dataset,
                                                                               modes=False)


def test_a_job_waits_for_another_filling_the_same_entry(jobs: Jobs, dataset: Path,
                                                        cache: Cache) -> None:
    with SourceTree(str(dataset), prove_read=True) as tree:
        key = cache.key_for(tree.manifest)
    results: list[StageItem] = []
    scratch = jobs.scratch()
    with cache.claim(key) as held:  # another job's fill, in progress
        assert held.hit is False
        stager = threading.Thread(target=lambda: results.append(
            jobs.stage(f"{dataset}:data", cache, scratch=scratch)[1]))
        stager.start()
        time.sleep(1.0)
        assert stager.is_alive() and not results  # waiting for the lock
    stager.join(60)
    [item] = results
    assert item.cache_hit is False  # the other "job" never finished: this one fills it
    assert item.cache_wait >= 0.9
    assert digest(scratch / "data", modes=False) == digest(dataset, modes=False)


def test_an_incomplete_entry_is_never_used_and_is_rebuilt(jobs: Jobs, dataset: Path,
                                                          cache: Cache) -> None:
    jobs.stage(f"{dataset}:data", cache)
    [entry] = cache.entries()
    folder = cache.root / "entries" / entry.key
    (folder / "complete.json").unlink()  # a crash before the marker
    damaged = folder / "data" / "sub" / "big.bin"
    damaged.chmod(0o644)
    damaged.write_bytes(b"half")
    assert [e.complete for e in cache.entries()] == [False]
    scratch, item = jobs.stage(f"{dataset}:data", cache)
    assert item.cache_hit is False
    assert digest(scratch / "data", modes=False) == digest(dataset, modes=False)
    assert [e.complete for e in cache.entries()] == [True]


def _file_dataset(area: Path, name: str, size: int) -> Path:
    path = area / "shared" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    return path


def test_least_recently_used_entries_are_evicted_under_the_cap(jobs: Jobs, area: Path) -> None:
    cache = Cache(area / "cache", max_bytes=int(2.5 * MIB))
    a, b, c = (_file_dataset(area, n, MIB) for n in "abc")
    jobs.stage(f"{a}:x", cache)
    jobs.stage(f"{b}:x", cache)
    assert jobs.stage(f"{a}:x", cache)[1].cache_hit is True  # a is now the most recent
    jobs.stage(f"{c}:x", cache)  # room for c: b goes
    assert sorted(Path(e.source).name for e in cache.entries()) == ["a", "c"]
    assert cache.usage() <= cache.max_bytes
    assert jobs.stage(f"{b}:x", cache)[1].cache_hit is False


def test_a_dataset_larger_than_the_cap_is_staged_without_the_cache(jobs: Jobs, dataset: Path,
                                                                   area: Path) -> None:
    cache = Cache(area / "cache", max_bytes=MIB)
    scratch, item = jobs.stage(f"{dataset}:data", cache)
    assert item.cache_hit is None
    assert cache.entries() == []
    assert digest(scratch / "data") == digest(dataset)


def test_a_root_only_file_is_refused_and_nothing_is_cached(jobs: Jobs, dataset: Path,
                                                           cache: Cache) -> None:
    (dataset / "sub" / "one-byte").chmod(0o600)
    scratch = jobs.scratch()
    with pytest.raises(UserInputError, match="'sub/one-byte' cannot be read by the job's user"):
        jobs.stage(f"{dataset}:data", cache, scratch=scratch)
    assert cache.entries() == []
    assert os.listdir(scratch) == []


def test_a_cached_entry_is_not_handed_to_a_user_who_cannot_read_the_source(
        jobs: Jobs, dataset: Path, cache: Cache) -> None:
    """A job of root cached a dataset with a root-only file; jwtest asks for the very same
    dataset (same key): the entry is there, and still jwtest must prove read access."""
    (dataset / "a.txt").chmod(0o600)
    root_scratch = prepare_scratch(jobs.area / "scratch", "399", UserIds.current())
    stage_in([parse_stage_in(f"{dataset}:data")], scratch=root_scratch,
             user=UserIds.current(), cache=cache, settings=SETTINGS)
    assert [e.complete for e in cache.entries()] == [True]
    scratch = jobs.scratch()
    with pytest.raises(UserInputError, match=r"'a\.txt' cannot be read by the job's user"):
        jobs.stage(f"{dataset}:data", cache, scratch=scratch)
    assert os.listdir(scratch) == []


def test_a_changed_source_is_a_new_entry(jobs: Jobs, dataset: Path, cache: Cache) -> None:
    jobs.stage(f"{dataset}:data", cache)
    (dataset / "a.txt").write_text("changed\n")
    scratch, item = jobs.stage(f"{dataset}:data", cache)
    assert item.cache_hit is False
    assert (scratch / "data" / "a.txt").read_text() == "changed\n"


def test_content_keys_find_the_same_data_anywhere(jobs: Jobs, area: Path,
                                                  make_dataset: MakeDataset) -> None:
    cache = Cache(area / "cache", max_bytes=64 * MIB, key_mode="sha256")
    one = make_dataset(area / "shared" / "one", big=MIB)
    two = area / "shared" / "two"
    subprocess.run(["cp", "-a", str(one), str(two)], check=True)
    assert jobs.stage(f"{one}:d", cache)[1].cache_hit is False
    scratch, item = jobs.stage(f"{two}:d", cache)
    assert item.cache_hit is True
    assert digest(scratch / "d", modes=False, mtimes=False) == digest(two, modes=False,
                                                                      mtimes=False)


def test_copy_mode_gives_the_user_their_own_files(jobs: Jobs, dataset: Path, area: Path,
                                                  user: UserIds) -> None:
    cache = Cache(area / "cache", max_bytes=64 * MIB, link="copy")
    jobs.stage(f"{dataset}:data", cache)
    scratch, item = jobs.stage(f"{dataset}:data", cache)
    assert item.cache_hit is True
    assert digest(scratch / "data") == digest(dataset)  # modes too
    big = os.stat(scratch / "data" / "sub" / "big.bin")
    assert (big.st_uid, big.st_nlink) == (user.uid, 1)


def test_across_file_systems_the_cache_copies(jobs: Jobs, dataset: Path, cache: Cache,
                                              area: Path, user: UserIds, tmpfs: Tmpfs) -> None:
    jobs.stage(f"{dataset}:data", cache)
    with tmpfs(area / "local", "16m") as local:
        scratch = prepare_scratch(local / "scratch", "500", user)
        _, item = jobs.stage(f"{dataset}:data", cache, scratch=scratch)
        assert item.cache_hit is True
        assert digest(scratch / "data") == digest(dataset)
        assert os.stat(scratch / "data" / "a.txt").st_uid == user.uid


def test_too_big_for_scratch_fails_before_filling_the_cache(jobs: Jobs, dataset: Path,
                                                            cache: Cache, area: Path,
                                                            user: UserIds, tmpfs: Tmpfs) -> None:
    with tmpfs(area / "local", "2m") as local:
        scratch = prepare_scratch(local / "scratch", "501", user)
        with pytest.raises(UserInputError, match=r"but only 2\.0 MiB is free"):
            jobs.stage(f"{dataset}:data", cache, scratch=scratch)
        assert cache.entries() == [] and os.listdir(scratch) == []


def test_an_archive_is_cached_and_unpacked_per_job(jobs: Jobs, dataset: Path,
                                                   cache: Cache) -> None:
    archive = dataset.parent / "ds.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(dataset, arcname=".")
    _, miss = jobs.stage(f"{archive}:d:unpack", cache)
    second, hit = jobs.stage(f"{archive}:d:unpack", cache)
    assert (miss.cache_hit, hit.cache_hit) == (False, True)
    assert hit.unpacked and hit.files == 6
    assert digest(second / "d", resolution_ns=MS) == digest(dataset, resolution_ns=MS)
    assert os.stat(second / "d" / "a.txt").st_uid == jobs.user.uid  # unpacked by the user


def test_sha256_verification_on_a_hit_catches_a_damaged_entry(jobs: Jobs, dataset: Path,
                                                              cache: Cache) -> None:
    sha = StageSettings(free_margin_bytes=0, verify="sha256")
    _, miss = jobs.stage(f"{dataset}:data", cache, sha)
    _, hit = jobs.stage(f"{dataset}:data", cache, sha)
    real = hashlib.sha256((dataset / "sub" / "big.bin").read_bytes()).hexdigest()
    assert miss.checksums["data/sub/big.bin"] == hit.checksums["data/sub/big.bin"] == real
    [entry] = cache.entries()
    cached = cache.root / "entries" / entry.key / "data" / "sub" / "big.bin"
    with open(cached, "r+b") as handle:  # bit rot
        handle.write(b"\xff")
    with pytest.raises(StagingError, match="no longer matches its checksum"):
        jobs.stage(f"{dataset}:data", cache, sha)


def test_the_cache_from_the_config() -> None:
    assert Cache.from_config("/x", StagingConfig(cache=False)) is None
    cache = Cache.from_config("/x", StagingConfig(cache_max_gib=0.5, cache_link="copy"))
    assert cache is not None
    assert (cache.max_bytes, cache.link, cache.key_mode) == (512 * MIB, "copy", "stat")


def test_the_first_job_is_linked_to_the_cache_in_one_pass(jobs: Jobs, dataset: Path,
                                                          cache: Cache, user: UserIds) -> None:
    scratch, item = jobs.stage(f"{dataset}:data", cache)
    assert item.cache_hit is False and item.files == 6
    [entry] = cache.entries()
    cached = cache.root / "entries" / entry.key / "data"
    for name in ("a.txt", "sub/big.bin", "sub/deep/empty", "run.sh"):
        mine, theirs = os.stat(scratch / "data" / name), os.stat(cached / name)
        assert (mine.st_ino, mine.st_nlink, mine.st_uid) == (theirs.st_ino, 2, 0), name
    assert digest(scratch / "data", modes=False) == digest(dataset, modes=False)
    for folder in (scratch / "data", scratch / "data" / "sub", scratch / "data" / "empty-dir"):
        assert os.stat(folder).st_uid == user.uid


def _full_at(count: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Root's cache copies run out of space at the ``count``-th file (the worker's own
    copies, made with the user's rights, do not)."""
    from wrapper.staging import copy as engine

    real = engine.write_file
    calls = [0]

    def write_file(*args: Any, **kwargs: Any) -> Any:
        if os.geteuid() == 0:
            calls[0] += 1
            if calls[0] == count:
                raise engine.write_error("x", OSError(28, "No space left on device"))
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "write_file", write_file)


@pytest.mark.parametrize("dest", ["data", "."])
def test_a_one_pass_fill_that_finds_the_disk_full_takes_back_its_links(
        jobs: Jobs, area: Path, cache: Cache, user: UserIds, dest: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 450 files in three folders; the cache fills up in the third. The links already
    # placed are taken back, the cache is bypassed, and the worker's own copy lands in
    # the same place (into a DEST made here, or straight into scratch).
    source = area / "shared" / "many"
    for d in range(3):
        (source / f"part-{d}").mkdir(parents=True)
        for f in range(150):
            (source / f"part-{d}" / f"s{f:03d}").write_bytes(os.urandom(100))
    _full_at(400, monkeypatch)
    scratch, item = jobs.stage(f"{source}:{dest}", cache)
    assert item.cache_hit is None and item.files == 450
    staged = scratch / "data" if dest == "data" else scratch
    assert digest(staged, modes=False) == digest(source, modes=False)
    for path in staged.rglob("s*"):
        info = path.lstat()
        assert (info.st_uid, info.st_nlink) == (user.uid, 1), path  # the user's own copy
    assert cache.entries() == []


def test_a_one_pass_fill_that_fails_for_the_job_leaves_neither_links_nor_entry(
        jobs: Jobs, dataset: Path, area: Path, cache: Cache, make_dataset: MakeDataset) -> None:
    other = make_dataset(area / "shared" / "other")
    (other / "sub" / "big.bin").write_bytes(b"another")
    scratch = jobs.scratch()
    (scratch / "mine").mkdir()
    with pytest.raises(UserInputError, match="already exists"):
        stage_in([parse_stage_in(f"{dataset}:."), parse_stage_in(f"{other}:.")],
                 scratch=scratch, user=jobs.user, cache=cache, settings=SETTINGS, timeout=120)
    # the first directive's data stays (the stage failed: the job does not start); the
    # second's partial links are gone, and its half-filled entry with them
    assert [e.complete for e in cache.entries()] == [True]
    assert sorted(os.listdir(scratch)) == sorted(["mine", *os.listdir(dataset)])
    assert (scratch / "sub" / "big.bin").read_bytes() == (dataset / "sub" / "big.bin").read_bytes()


def test_a_first_fill_is_used_this_boot_and_only_after_settle_in_the_next(
        jobs: Jobs, dataset: Path, cache: Cache, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first stage writes its entry complete but not durable (no syncfs on the job's
    start path): this boot's page cache serves it; a reboot before the epilog's settle
    may have lost its data, so the next boot fills it again; once settled, it stays."""
    import json

    from wrapper.staging import cache as cache_mod

    jobs.stage(f"{dataset}:data", cache)
    [entry] = cache.entries()
    marker_path = cache.root / "entries" / entry.key / "complete.json"
    marker = json.loads(marker_path.read_text())
    assert (marker["v"], marker["synced"], marker["boot"]) == (2, False, cache_mod.boot_id())
    assert (cache.root / "unsynced" / entry.key).exists()
    _, hit = jobs.stage(f"{dataset}:data", cache)
    assert hit.cache_hit is True  # the same boot: its page cache is the truth
    monkeypatch.setattr(cache_mod, "_boot", ["another-boot"])  # a reboot, not settled
    assert [e.complete for e in cache.entries()] == [False]
    _, refill = jobs.stage(f"{dataset}:data", cache)
    assert refill.cache_hit is False
    [entry] = cache.entries()
    assert cache.settle() == 1  # the epilog: one syncfs, the marker says so
    assert cache.settle() == 0 and not (cache.root / "unsynced" / entry.key).exists()
    marker = json.loads((cache.root / "entries" / entry.key / "complete.json").read_text())
    assert marker["synced"] is True
    monkeypatch.setattr(cache_mod, "_boot", ["a-third-boot"])
    _, after = jobs.stage(f"{dataset}:data", cache)
    assert after.cache_hit is True


def test_a_marker_of_format_1_is_still_complete(jobs: Jobs, dataset: Path,
                                                cache: Cache) -> None:
    """An entry an older jobwrap filled (synced before its marker, no boot in it)."""
    import json

    jobs.stage(f"{dataset}:data", cache)
    [entry] = cache.entries()
    marker_path = cache.root / "entries" / entry.key / "complete.json"
    old = {k: v for k, v in json.loads(marker_path.read_text()).items()
           if k not in ("boot", "synced")}
    marker_path.chmod(0o644)
    marker_path.write_text(json.dumps({**old, "v": 1}))
    _, hit = jobs.stage(f"{dataset}:data", cache)
    assert hit.cache_hit is True
