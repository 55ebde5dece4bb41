from __future__ import annotations

import gzip
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from wrapper.archive._fs import Access, ArchiveError, create_file
from wrapper.archive.store import (
    Writer,
    extract,
    list_archives,
    load_manifest,
    prune,
    read_parts,
)
from wrapper.osl.child import call_as as as_user
from wrapper.osl.users import AsUserError, UserIds

DAY = 86400.0


def manifest_of(updated_at: float) -> Any:
    def build(parts: list[dict[str, Any]]) -> dict[str, Any]:
        return {"updated_at": updated_at, "job": {"name": "train"},
                "attempts": [{"attempt": p["attempt"]} for p in parts],
                "archive": {"complete": True,
                            "parts": [[p["attempt"], p["node"]] for p in parts]}}
    return build


def write(root: Path, user: UserIds, job_id: str, attempt: int, node: str, *,
          updated_at: float = 1000.0, payload: bytes = b"out\n") -> str:
    with Writer(str(root), user.name, job_id, node, Access(gid=user.gid)) as writer:
        part = writer.part_dir(attempt)
        fd = create_file(part, "stdout.gz", writer.access)
        os.write(fd, gzip.compress(payload))
        os.close(fd)
        writer.write_part(attempt, {"complete": True})
        return writer.commit(manifest_of(updated_at))


def read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_two_attempts_and_two_nodes_end_up_in_one_archive(user: UserIds, root: Path) -> None:
    path = write(root, user, "7", 0, "n1")
    write(root, user, "7", 0, "n2")
    assert write(root, user, "7", 1, "n1") == path == str(root / user.name / "7")
    manifest = read(root / user.name / "7" / "manifest.json")
    assert manifest["archive"]["parts"] == [[0, "n1"], [0, "n2"], [1, "n1"]]
    for rel in ("attempt-0/n1/stdout.gz", "attempt-0/n2/stdout.gz", "attempt-1/n1/stdout.gz"):
        assert (root / user.name / "7" / rel).is_file()
    # no temporaries or trash left behind
    assert [p.name for p in (root / user.name).iterdir() if p.name.endswith(".tmp")] == []


def test_an_interrupted_first_store_leaves_nothing_that_looks_complete(
        user: UserIds, root: Path) -> None:
    def boom(parts: list[dict[str, Any]]) -> dict[str, Any]:
        raise RuntimeError("the epilog died here")

    with pytest.raises(RuntimeError, match="the epilog died here"), \
            Writer(str(root), user.name, "8", "n1", Access(gid=user.gid)) as writer:
        writer.write_part(0, {"complete": True})
        writer.commit(boom)
    assert not (root / user.name / "8").exists()
    assert list_archives(str(root)) == []
    write(root, user, "8", 0, "n1")  # the next epilog does it all
    assert [i.job_id for i in list_archives(str(root))] == ["8"]


def test_a_killed_writer_is_cleaned_up_and_finished_by_the_next(user: UserIds, root: Path) -> None:
    write(root, user, "9", 0, "n1")
    pid = os.fork()
    if pid == 0:  # the epilog of attempt 1, killed after its files, before its commit
        try:
            with Writer(str(root), user.name, "9", "n1", Access(gid=user.gid)) as writer:
                writer.write_part(1, {"complete": True})
                os.kill(os.getpid(), 9)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status)
    leftovers = [p for p in (root / user.name).iterdir() if p.name.endswith(".tmp")]
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".9.n1.")
    manifest = read(root / user.name / "9" / "manifest.json")
    assert manifest["archive"]["parts"] == [[0, "n1"]]  # attempt 1 is not claimed
    write(root, user, "9", 1, "n1")
    assert read(root / user.name / "9" / "manifest.json")["archive"]["parts"] == [[0, "n1"],
                                                                                  [1, "n1"]]
    assert not leftovers[0].exists()  # the dead epilog's temporary is gone


def test_a_failed_merge_never_lists_a_part_that_is_not_there(user: UserIds, root: Path) -> None:
    write(root, user, "10", 0, "n1", payload=b"first\n")
    calls: list[int] = []

    def dies_after_dropping(parts: list[dict[str, Any]]) -> dict[str, Any]:
        calls.append(len(parts))
        if len(calls) == 2:
            raise RuntimeError("killed during the swap")
        return manifest_of(2000.0)(parts)

    with pytest.raises(RuntimeError, match="killed during the swap"), \
            Writer(str(root), user.name, "10", "n1", Access(gid=user.gid)) as writer:
        writer.write_part(0, {"complete": True})  # the same part again: a redo
        writer.commit(dies_after_dropping)
    assert read(root / user.name / "10" / "manifest.json")["archive"]["parts"] == []
    write(root, user, "10", 0, "n1", payload=b"second\n")
    job = root / user.name / "10"
    assert read(job / "manifest.json")["archive"]["parts"] == [[0, "n1"]]
    assert gzip.decompress((job / "attempt-0/n1/stdout.gz").read_bytes()) == b"second\n"
    assert [p.name for p in job.iterdir() if p.name.startswith(".trash")] == []


def test_permissions_are_the_users_and_admins_only(user: UserIds, root: Path) -> None:
    write(root, user, "11", 0, "n1")
    assert stat.S_IMODE(root.stat().st_mode) == 0o711
    for path in [root / user.name, *(root / user.name / "11").rglob("*")]:
        info = path.lstat()
        assert (info.st_uid, info.st_gid) == (0, user.gid), path
        expected = 0o750 if stat.S_ISDIR(info.st_mode) else 0o640
        assert stat.S_IMODE(info.st_mode) == expected, path
    manifest = str(root / user.name / "11" / "manifest.json")
    assert json.loads(as_user(user, Path.read_text, Path(manifest)))["job"]["name"] == "train"
    nobody = UserIds.of(65534)
    with pytest.raises(AsUserError, match="Permission denied"):
        as_user(nobody, os.listdir, str(root))
    with pytest.raises(AsUserError, match="Permission denied"):
        as_user(nobody, os.listdir, str(root / user.name))


def test_acl_access_lets_only_the_user_and_the_admin_group_read(user: UserIds, root: Path) -> None:
    with Writer(str(root), user.name, "12", "n1", Access(gid=0, acl_uid=user.uid),
                root_mode=0o751) as writer:
        writer.write_part(0, {"complete": True})
        writer.commit(manifest_of(1.0))
    job = root / user.name / "12"
    assert job.stat().st_gid == 0 and (job / "manifest.json").stat().st_gid == 0
    assert os.getxattr(job / "manifest.json", "system.posix_acl_access")
    assert "manifest.json" in as_user(user, os.listdir, str(job))
    assert as_user(user, Path.read_text, Path(job / "manifest.json")).startswith("{")
    nobody = UserIds.of(65534)
    with pytest.raises(AsUserError, match="Permission denied"):
        as_user(nobody, Path.read_text, Path(job / "manifest.json"))


def test_list_show_and_extract(shared: Path, user: UserIds, root: Path) -> None:
    write(root, user, "20", 0, "n1", updated_at=100.0, payload=b"hello\n")
    write(root, user, "21", 0, "n1", updated_at=300.0)
    found = list_archives(str(root))
    assert [(i.job_id, i.user, i.complete, i.name) for i in found] == [
        ("20", user.name, True, "train"), ("21", user.name, True, "train")]
    assert [i.job_id for i in list_archives(str(root), since=200.0)] == ["21"]
    assert list_archives(str(root), user="someone-else") == []
    assert list_archives(str(shared / "never-made")) == []
    assert load_manifest(str(root), "20")["updated_at"] == 100.0
    with pytest.raises(ArchiveError, match="no archive of job 99"):
        load_manifest(str(root), "99")
    dest = shared / "out"
    written = extract(str(root), "20", str(dest))
    assert sorted(Path(p).relative_to(dest).as_posix() for p in written) == [
        "attempt-0/n1/part.json", "attempt-0/n1/stdout", "manifest.json"]
    assert (dest / "attempt-0/n1/stdout").read_bytes() == b"hello\n"
    with pytest.raises(ArchiveError, match="never overwrites"):
        extract(str(root), "20", str(dest))


def test_extract_never_writes_through_a_symlink(shared: Path, user: UserIds, root: Path) -> None:
    write(root, user, "22", 0, "n1")
    dest = shared / "out"
    dest.mkdir()
    victim = shared / "victim"
    victim.mkdir()
    (dest / "attempt-0").symlink_to(victim)
    with pytest.raises(OSError):
        extract(str(root), "22", str(dest))
    assert list(victim.iterdir()) == []


def test_a_symlink_inside_the_archive_is_never_followed(
        shared: Path, user: UserIds, root: Path) -> None:
    write(root, user, "23", 0, "n1")
    elsewhere = shared / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("keep\n")
    (root / user.name / "24").symlink_to(elsewhere)  # planted: looks like a job's folder
    assert [i.job_id for i in list_archives(str(root))] == ["23"]
    with pytest.raises(ArchiveError, match="symlink"):
        load_manifest(str(root), "24")
    assert prune(str(root), 0.001, 0, now=1e12) != []
    assert (elsewhere / "precious").read_text() == "keep\n"
    job_fd = os.open(root / user.name, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert read_parts(job_fd) == []
    finally:
        os.close(job_fd)


def test_prune_by_age_then_by_size_oldest_first(user: UserIds, root: Path) -> None:
    now = 100 * DAY
    for job_id, age_days in (("30", 40), ("31", 20), ("32", 10), ("33", 1)):
        write(root, user, job_id, 0, "n1", updated_at=now - age_days * DAY,
              payload=os.urandom(20000))
    sizes = {i.job_id: i.size for i in list_archives(str(root))}
    assert prune(str(root), 30, 0, now, dry_run=True)[0].info.job_id == "30"
    assert len(list_archives(str(root))) == 4  # a dry run removes nothing
    removed = prune(str(root), 30, 0, now)
    assert [(r.info.job_id, r.reason) for r in removed] == [("30", "age")]
    # what remains must fit in two archives' size: the oldest go first
    budget = sizes["32"] + sizes["33"]
    removed = prune(str(root), 30, budget, now)
    assert [(r.info.job_id, r.reason) for r in removed] == [("31", "size")]
    assert [i.job_id for i in list_archives(str(root))] == ["32", "33"]
    assert prune(str(root), 0, 0, now) == []  # 0 means no limit


def test_prune_leaves_an_archive_being_written(user: UserIds, root: Path) -> None:
    write(root, user, "40", 0, "n1", updated_at=1.0)
    import fcntl
    fd = os.open(root / user.name / ".40.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert prune(str(root), 1, 0, now=10 * DAY) == []
    finally:
        os.close(fd)
    assert [r.info.job_id for r in prune(str(root), 1, 0, now=10 * DAY)] == ["40"]
    assert not (root / user.name / "40").exists()


def test_bad_names_never_become_paths(user: UserIds, root: Path) -> None:
    for user_name, job_id, node in (("../etc", "1", "n1"), ("u", "1/2", "n1"),
                                    ("u", "1", "../n1"), ("u", "1", ".hidden")):
        with pytest.raises(ArchiveError):
            Writer(str(root), user_name, job_id, node, Access(gid=user.gid))


def test_nodes_archiving_at_once_all_land_in_the_manifest(user: UserIds, root: Path) -> None:
    nodes = [f"n{i}" for i in range(1, 7)]
    pids = []
    for node in nodes:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                write(root, user, "50", 0, node, payload=node.encode())
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    assert all(os.waitpid(pid, 0)[1] == 0 for pid in pids)
    manifest = read(root / user.name / "50" / "manifest.json")
    assert manifest["archive"]["parts"] == [[0, node] for node in nodes]
    assert [p.name for p in (root / user.name).iterdir() if p.name.endswith(".tmp")] == []
