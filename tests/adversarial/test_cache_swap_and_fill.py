"""The node cache against a racing user and a full disk (issue 12, items 9 and 13).

Item 9 races root's scan with the job user's own process swapping the symlink it named
as its stage-in source; item 13 stages the user's data into a cache on a small real
tmpfs that fills up.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.staging import Tmpfs, digest
from wrapper.errors import UserInputError
from wrapper.staging import Cache, StageSettings, UserIds, parse_stage_in, prepare_scratch
from wrapper.staging import stage_in as copy_in
from wrapper.staging.cache import CacheFull, Claim
from wrapper.staging.stagein import source_of
from wrapper.staging.tree import Manifest, SourceTree

SETTINGS = StageSettings(free_margin_bytes=0)
MIB = 1 << 20

FLIPPER = """
import os, sys
link, a, b, stop = sys.argv[1:]
n = 0
while not os.path.exists(stop):
    tmp = f"{link}.{n % 2}"
    os.symlink(a if n % 2 else b, tmp)
    os.rename(tmp, link)
    n += 1
"""


def two_trees(base: Path) -> tuple[Path, Path]:
    a, b = base / "tree-a", base / "tree-b"
    for tree in (a, b):
        tree.mkdir(parents=True)
        (tree / f"only-in-{tree.name}").write_text(tree.name)
    return a, b


# -- item 9: the key names the tree that was read ------------------------------------------
def test_a_symlink_swapped_during_the_scan_never_mislabels_the_source(
        area: Path, user: UserIds) -> None:
    home = area / "home"  # the job user's own folder, where it names its source
    a, b = two_trees(home)
    for path in (home, *home.rglob("*")):
        os.chown(path, user.uid, user.gid)
    link, stop = home / "link", area / "stop"
    os.symlink(a, link)
    os.lchown(link, user.uid, user.gid)
    flipper = subprocess.Popen([os.path.realpath(sys.executable), "-c", FLIPPER, str(link),
                                str(a), str(b), str(stop)], user=user.uid, group=user.gid,
                               extra_groups=[], cwd=home)
    wrong, seen = [], set()
    try:
        for _ in range(3000):
            try:
                with SourceTree(str(link)) as src:
                    manifest = src.manifest
            except UserInputError:
                continue  # "changed while it was being staged": refused, fine
            names = {e.path for e in manifest.entries}
            seen.add(manifest.source)
            if f"only-in-{Path(manifest.source).name}" not in names:
                wrong.append((manifest.source, sorted(names)))
    finally:
        stop.touch()
        flipper.wait(timeout=10)
    assert seen == {str(a), str(b)}, seen  # the swap really raced the scans
    assert not wrong, f"{len(wrong)} scans labelled one tree with the other's path: {wrong[:3]}"


def test_root_names_the_source_from_the_descriptor_not_the_workers_word(
        area: Path) -> None:
    a, b = two_trees(area)
    with SourceTree(str(a)) as src:
        told = src.manifest
        assert source_of(told, [src.root_fd]) is told
    fd = os.open(b, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(UserInputError, match="moved while it was being staged"):
            source_of(told, [fd])  # a worker that says tree-a but read tree-b
        lying = Manifest(source=str(b), kind="file", entries=told.entries)
        with pytest.raises(UserInputError, match="changed while it was being staged"):
            source_of(lying, [fd])
    finally:
        os.close(fd)


# -- item 13: a full cache is the node's problem, never the job's -----------------------------
def small_files(root: Path, count: int, size: int) -> Path:
    root.mkdir(parents=True)
    for i in range(count):
        (root / f"f{i:04d}").write_bytes(os.urandom(size))
    for path in [root, *root.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


def stage(area: Path, user: UserIds, source: Path, cache: Cache, job: str) -> Path:
    scratch = prepare_scratch(area / "scratch", job, user)
    report = copy_in([parse_stage_in(f"{source}:data")], scratch=scratch, user=user,
                     cache=cache, settings=SETTINGS, timeout=120)
    [item] = report.items
    assert item.files == len(list(source.iterdir()))
    assert digest(scratch / "data") == digest(source)
    return scratch


def test_space_is_reserved_in_blocks_so_small_files_do_not_overfill(
        area: Path, user: UserIds, tmpfs: Tmpfs, monkeypatch: pytest.MonkeyPatch) -> None:
    # 400 one-byte files are 400 bytes, but 400 blocks on disk: more than this cache has.
    source = small_files(area / "shared" / "tiny", 400, 1)
    with tmpfs(area / "cache", "1m") as root:
        os.chmod(root, 0o700)
        cache = Cache(root, max_bytes=64 * MIB)
        asked: list[tuple[int, bool]] = []
        filled: list[str] = []
        reserve, fill = cache.reserve, cache.fill

        def spy_reserve(claim: Claim, need: int, files: int = 0) -> bool:
            asked.append((need, reserve(claim, need, files)))
            return asked[-1][1]

        def spy_fill(claim: Claim, *args: Any, **kwargs: Any) -> Any:
            filled.append(claim.key)
            return fill(claim, *args, **kwargs)

        monkeypatch.setattr(cache, "reserve", spy_reserve)
        monkeypatch.setattr(cache, "fill", spy_fill)
        stage(area, user, source, cache, "701")
        # refused up front, counting whole blocks (not 400 bytes), and never filled
        [(need, granted)] = asked
        assert need >= 400 * os.statvfs(root).f_bsize and not granted, asked
        assert filled == []
        assert [e for e in cache.entries() if e.complete] == []
        assert os.listdir(root / "trash") == []


@pytest.mark.parametrize("size", [4096, 8192])
def test_a_cache_that_fills_up_mid_copy_is_bypassed_and_emptied(area: Path, user: UserIds,
                                                                size: int, tmpfs: Tmpfs) -> None:
    # 300 files in three batches of descriptors; the disk fills in the first (8 KiB
    # files) or the second (4 KiB) batch. The negative margin makes the reservation
    # believe in 2 MiB that are not there, as when another writer fills the disk between
    # the reservation and the copy.
    source = small_files(area / "shared" / f"set{size}", 300, size)
    with tmpfs(area / "cache", "1m") as root:
        os.chmod(root, 0o700)
        cache = Cache(root, max_bytes=64 * MIB, free_margin_bytes=-2 * MIB)
        scratch = stage(area, user, source, cache, f"70{size // 4096 + 1}")
        assert os.stat(scratch / "data" / "f0000").st_uid == user.uid  # the user's copy
        assert cache.entries() == [] and os.listdir(root / "trash") == []
        assert os.statvfs(root).f_bfree * os.statvfs(root).f_frsize > 900 * 1024


def test_a_fill_that_finds_the_disk_full_drops_its_entry(area: Path, tmpfs: Tmpfs) -> None:
    source = small_files(area / "shared" / "mid", 20, 64 * 1024)
    with tmpfs(area / "cache", "2m") as root:
        os.chmod(root, 0o700)
        cache = Cache(root, max_bytes=64 * MIB)
        with SourceTree(str(source)) as src:
            manifest = src.manifest
            key = cache.key_for(manifest)
            with cache.claim(key) as claim:
                assert isinstance(claim, Claim) and not claim.hit
                assert cache.reserve(claim, cache.disk_bytes(manifest), len(manifest.entries))
                filler = root / "filler"  # another writer takes the space meanwhile
                with open(filler, "wb", buffering=0) as handle, pytest.raises(OSError):
                    while True:
                        handle.write(b"\0" * 65536)
                batches = [[(e, src.open(e)) for e in manifest.files]]
                with pytest.raises(CacheFull, match="is full"):
                    cache.fill(claim, manifest, batches, verify="size", parallel=2)
                filler.unlink()
        assert cache.entries() == [] and os.listdir(root / "trash") == []


# -- the one-pass first stage: the cache and scratch on one file system ----------------------


def test_the_first_jobs_links_are_the_caches_read_only_inodes(area: Path,
                                                               user: UserIds) -> None:
    # The first job's files are hard links made while the cache was filled: the user
    # can read them, and can neither write, truncate, chmod nor re-link them elsewhere
    # to keep a writable name; only its own link can be removed or renamed.
    source = small_files(area / "shared" / "ro", 20, 10240)
    cache = Cache(area / "cache", max_bytes=64 * MIB)
    scratch = prepare_scratch(area / "scratch", "720", user)
    report = copy_in([parse_stage_in(f"{source}:data")], scratch=scratch, user=user,
                     cache=cache, settings=SETTINGS, timeout=120)
    assert report.items[0].cache_hit is False
    linked = scratch / "data" / "f0000"
    info = linked.lstat()
    assert (info.st_uid, info.st_nlink, info.st_mode & 0o7777) == (0, 2, 0o444)
    before = linked.read_bytes()
    assert before == (source / "f0000").read_bytes()
    script = """
import os, sys
path, other = sys.argv[1:]
out = []
for name, act in [("write", lambda: open(path, "r+b")), ("truncate", lambda: os.truncate(path, 0)),
                  ("chmod", lambda: os.chmod(path, 0o666)), ("link", lambda: os.link(path, other))]:
    try:
        act()
        out.append(name + ":ok")
    except OSError as exc:
        out.append(name + ":" + type(exc).__name__)
print(" ".join(out))
"""
    other = scratch / "data" / "mine"
    # the interpreter itself, not the venv's link to it (under root's 0700 home in CI)
    done = subprocess.run([os.path.realpath(sys.executable), "-I", "-c", script, str(linked),
                           str(other)],
                          user=user.uid, group=user.gid, extra_groups=[], check=True,
                          capture_output=True, text=True, cwd="/")
    # (a link may be allowed where protected_hardlinks is off; it shares the read-only
    # inode then, and still cannot write it)
    words = dict(w.split(":") for w in done.stdout.split())
    assert (words["write"], words["truncate"], words["chmod"]) == ("PermissionError",) * 3
    assert linked.read_bytes() == before
    [entry] = cache.entries()
    cached = cache.root / "entries" / entry.key / "data" / "f0000"
    assert cached.read_bytes() == before and os.stat(cached).st_ino == info.st_ino
