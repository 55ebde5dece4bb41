"""What counts as root's: folders, files, programs, mappings and loader variables."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from wrapper.loginguard.trust import Trust


def test_root_folders_and_files(tmp_path: Path) -> None:
    trust = Trust()
    assert trust.root_dir("/usr/bin") and not trust.root_dir("/tmp")
    python = os.path.realpath(sys.executable)
    assert python.startswith("/usr/") and trust.root_file(python) is not None
    assert trust.root_file("/usr/bin/../bin/true") is None  # not a canonical path
    assert trust.root_file("relative") is None
    copy = tmp_path / "make"  # root's file, but in a folder under /tmp
    shutil.copy(python, copy)
    copy.chmod(0o755)
    assert trust.root_file(str(copy)) is None


def test_loader_variables() -> None:
    trust = Trust()
    clean = b"HOME=/root\0LD_LIBRARY_PATH=/usr/lib:/lib\0LD_PRELOAD=libjemalloc.so.2\0"
    assert trust.foreign_loader_setting(clean) == ""
    for bad in (b"LD_PRELOAD=/tmp/burn.so", b"LD_LIBRARY_PATH=/usr/lib::/lib",
                b"LD_LIBRARY_PATH=/home/x/lib", b"LD_AUDIT=/dev/shm/a.so"):
        assert trust.foreign_loader_setting(b"A=1\0" + bad + b"\0") != "", bad


def test_mappings() -> None:
    trust = Trust()
    libc = os.path.realpath("/proc/self/exe")
    ino = os.stat(libc).st_ino
    ok = f"7f00-7f01 r-xp 00000000 00:00 {ino} {libc}\n7f02-7f03 r-xp 0 00:00 0 [vdso]\n"
    assert trust.foreign_code(ok.encode()) == ""
    data = f"7f00-7f01 rw-p 00000000 00:00 0 /tmp/data\n{ok}".encode()
    assert trust.foreign_code(data) == ""  # not code
    for bad in (f"7f00-7f01 r-xp 0 00:00 {ino + 1} {libc}",
                "7f00-7f01 r-xp 0 00:00 5 /tmp/burn.so",
                "7f00-7f01 r-xp 0 00:00 5 /memfd:x (deleted)"):
        assert trust.foreign_code(bad.encode()) != "", bad
