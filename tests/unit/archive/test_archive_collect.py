from __future__ import annotations

import gzip
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.archive import user_file
from wrapper.archive._fs import Access
from wrapper.archive.collect import (
    ARCHIVED,
    MISSING,
    PARTIAL,
    REFUSED,
    SKIPPED,
    ArchivedFile,
    Limits,
    OutputSpec,
    Sources,
    collect,
    copy_user_file,
)
from wrapper.job.state import JobState
from wrapper.osl.users import UserIds


@pytest.fixture
def dest(shared: Path) -> Iterator[int]:
    folder = shared / "part"
    folder.mkdir()
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def limits(seconds: float = 30.0, max_file: int = 1 << 30) -> Limits:
    return Limits(max_file_bytes=max_file, compress_level=1, hook_log_scan_bytes=1 << 20,
                  deadline=time.monotonic() + seconds)


def spec(kind: str, *paths: Path | str) -> OutputSpec:
    return OutputSpec(kind, f"{kind}.gz", tuple(str(p) for p in paths))


def unzipped(shared: Path, name: str) -> bytes:
    return gzip.decompress((shared / "part" / name).read_bytes())


def test_the_users_output_is_streamed_compressed_and_hashed(shared: Path, user: UserIds,
                                                           dest: int, work: Path) -> None:
    out = user_file(work / "job.out", user, "step 1\n" * 10000)
    entry = copy_user_file(dest, Access(gid=user.gid), spec("stdout", out), user, limits())
    assert entry.status == ARCHIVED
    assert unzipped(shared, "stdout.gz") == out.read_bytes()
    assert entry.size == entry.source_size == 70000
    assert 0 < entry.stored < entry.size
    import hashlib
    assert entry.sha256 == hashlib.sha256(out.read_bytes()).hexdigest()


def test_a_symlink_to_a_root_only_file_is_refused_and_not_archived(
        shared: Path, user: UserIds, dest: int, work: Path) -> None:
    secret = shared / "shadow"
    secret.write_text("root:secret-hash\n")
    os.chmod(secret, 0o600)
    link = work / "job.out"
    link.symlink_to(secret)
    entry = copy_user_file(dest, Access(gid=user.gid), spec("stdout", link), user, limits())
    assert entry.status == REFUSED
    assert "permission denied" in entry.error
    assert not (shared / "part" / "stdout.gz").exists()
    assert all(b"secret-hash" not in p.read_bytes() for p in (shared / "part").iterdir())


def test_a_fifo_is_refused_without_blocking(user: UserIds, dest: int, work: Path) -> None:
    fifo = work / "job.out"
    os.mkfifo(fifo)
    os.chown(fifo, user.uid, user.gid)
    started = time.monotonic()
    entry = copy_user_file(dest, Access(gid=user.gid), spec("stdout", fifo), user, limits())
    assert entry.status == REFUSED and entry.error == "not a regular file"
    assert time.monotonic() - started < 5


def test_missing_output_and_the_first_existing_candidate(user: UserIds, dest: int,
                                                         work: Path) -> None:
    entry = copy_user_file(dest, Access(gid=user.gid), spec("stdout", work / "nope"), user,
                           limits())
    assert entry.status == MISSING
    second = user_file(work / "b.out", user, "b\n")
    entry = copy_user_file(dest, Access(gid=user.gid),
                           spec("stderr", work / "a.out", second), user, limits())
    assert (entry.status, entry.source) == (ARCHIVED, str(second))


def test_a_large_log_keeps_its_tail(shared: Path, user: UserIds, dest: int,
                                    work: Path) -> None:
    out = user_file(work / "big.out", user,
                    "".join(f"line {i}\n" for i in range(100000)))
    entry = copy_user_file(dest, Access(gid=user.gid), spec("stdout", out), user,
                           limits(max_file=1000))
    assert entry.truncated and entry.size == 1000
    assert entry.source_size == out.stat().st_size
    assert unzipped(shared, "stdout.gz").endswith(b"line 99999\n")


def test_a_spent_budget_skips_and_a_slow_copy_is_cut_short(user: UserIds, dest: int,
                                                          work: Path) -> None:
    small = user_file(work / "small.out", user, "x\n")
    entry = copy_user_file(dest, Access(gid=user.gid), spec("stdout", small), user,
                           limits(seconds=-1))
    assert entry.status == SKIPPED
    # 16 GiB of zeros (sparse) cannot be compressed in 0.3 s: the child's timer ends it.
    huge = work / "huge.out"
    with open(huge, "wb") as handle:
        handle.truncate(16 << 30)
    os.chown(huge, user.uid, user.gid)
    started = time.monotonic()
    entry = copy_user_file(dest, Access(gid=user.gid), spec("stderr", huge), user,
                           limits(seconds=0.3))
    assert entry.status == PARTIAL
    assert "time budget" in entry.error
    assert 0 <= entry.size < 16 << 30
    assert time.monotonic() - started < 10


def test_collect_writes_every_kind_of_file(shared: Path, user: UserIds, dest: int,
                                          work: Path, job: JobState) -> None:
    out = user_file(work / "job.out", user, "hello\n")
    job.append("prolog.context", node="n1", attempt=1)
    (job.path / "supervisor.log").write_text(
        json.dumps({"event": "supervisor.start", "attempt": 0}) + "\n"
        + json.dumps({"event": "checkpoint.seen", "attempt": 1}) + "\n"
        + "Traceback (most recent call last):\n")
    log = shared / "jobwrap.log"
    log.write_text("\n".join(json.dumps(e) for e in [
        {"event": "prolog.done", "job_id": "42", "attempt": 1, "node": "n1"},
        {"event": "prolog.done", "job_id": "43", "attempt": 1, "node": "n1"},
        {"event": "epilog.done", "job_id": "42", "attempt": 0, "node": "n1"},
        {"event": "release.done", "job_id": "42"}]) + "\n")
    sources = Sources(job_id="42", attempt=1, state=job, events=job.events(), user=user,
                      outputs=(spec("stdout", out), OutputSpec("stderr", "stderr.gz",
                                                               (str(out),))),
                      script_text="#!/bin/bash\nsrun train.py\n", hook_log=str(log))
    files = collect(dest, Access(gid=user.gid), sources, limits())
    by_kind = {f.kind: f for f in files}
    assert [f.status for f in files] == [ARCHIVED] * 6
    assert by_kind["stderr"].same_as == "stdout.gz"  # one file, archived once
    assert not (shared / "part" / "stderr.gz").exists()
    assert unzipped(shared, "batch-script.sh.gz") == b"#!/bin/bash\nsrun train.py\n"
    supervisor = unzipped(shared, "supervisor.log.gz").decode()
    assert "checkpoint.seen" in supervisor and "supervisor.start" not in supervisor
    assert "Traceback" in supervisor  # what is not JSON is kept
    hooks = [json.loads(line) for line in unzipped(shared, "hooks.log.gz").splitlines()]
    assert [(h["event"], h.get("job_id")) for h in hooks] == [("prolog.done", "42"),
                                                              ("release.done", "42")]
    events = [json.loads(line) for line in unzipped(shared, "events.jsonl.gz").splitlines()]
    assert [e["event"] for e in events] == ["prolog.context"]


def test_no_known_user_means_no_user_file_is_read(shared: Path, dest: int) -> None:
    out = shared / "job.out"
    out.write_text("x\n")
    entry = copy_user_file(dest, Access(gid=0), spec("stdout", out), None, limits())
    assert entry.status == REFUSED
    assert isinstance(entry, ArchivedFile) and "never read with root's rights" in entry.error


def test_a_large_log_is_streamed_never_held_in_memory(shared: Path, user: UserIds,
                                                      work: Path) -> None:
    big = work / "big.out"
    with open(big, "wb") as handle:
        handle.truncate(384 << 20)  # 384 MiB, sparse: more than the bound below
    os.chown(big, user.uid, user.gid)
    folder = shared / "part"
    folder.mkdir()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # measure the archiving process alone
        code = 1
        try:
            import resource

            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            entry = copy_user_file(fd, Access(gid=user.gid), spec("stdout", big), user,
                                   limits(seconds=120))
            peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            os.write(write_fd, json.dumps([entry.status, entry.size, peak_kib]).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        status, size, peak_kib = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert (status, size) == (ARCHIVED, 384 << 20)
    assert peak_kib < 256 * 1024, f"peak RSS {peak_kib} KiB: the log was loaded into memory"
