"""The worker that holds the job user's rights, and the channel it talks to root through."""

from __future__ import annotations

import ctypes
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.staging import as_user
from wrapper.errors import UserInputError
from wrapper.staging import StagingError, UserIds
from wrapper.staging.channel import Channel
from wrapper.staging.privileges import Worker


def test_the_worker_has_the_users_ids_groups_and_nothing_more(user: UserIds) -> None:
    def probe() -> dict[str, Any]:
        try:
            os.setuid(0)
            regained = True
        except PermissionError:
            regained = False
        libc = ctypes.CDLL(None)
        return {"uid": list(os.getresuid()), "gid": list(os.getresgid()),
                "groups": sorted(os.getgroups()), "regained": regained,
                "dumpable": libc.prctl(3, 0, 0, 0, 0), "umask": os.umask(0o077)}

    seen = as_user(user, probe)
    assert seen["uid"] == [user.uid] * 3
    assert seen["gid"] == [user.gid] * 3
    assert seen["groups"] == sorted(user.groups)
    assert seen["regained"] is False
    assert seen["dumpable"] == 0  # the user's other processes cannot ptrace it
    assert seen["umask"] == 0o077


def test_the_worker_does_not_inherit_roots_descriptors(user: UserIds, tmp_path: Path) -> None:
    secret = tmp_path / "root-log"
    secret.write_text("")
    fd = os.open(secret, os.O_WRONLY | os.O_APPEND)  # like the hook's log file
    try:
        seen = as_user(user, lambda: {"open": sorted(int(n) for n in os.listdir(
            "/proc/self/fd"))})
    finally:
        os.close(fd)
    assert fd not in seen["open"]


def test_a_users_mistake_arrives_as_user_input_error(user: UserIds) -> None:
    def body(channel: Channel) -> None:
        raise UserInputError("--stage-in=x: SRC 'x' does not exist on this node")

    with Worker(user, body, timeout=30) as worker, pytest.raises(
            UserInputError, match=r"^--stage-in=x: SRC 'x' does not exist on this node$"):
        worker.recv()


def test_a_bug_in_the_worker_is_not_the_users_fault(user: UserIds) -> None:
    def body(channel: Channel) -> None:
        raise ZeroDivisionError("division by zero")

    with Worker(user, body, timeout=30) as worker, pytest.raises(
            StagingError, match="worker failed: ZeroDivisionError: division by zero"):
        worker.recv()


def test_a_worker_that_dies_is_reported(user: UserIds) -> None:
    def body(channel: Channel) -> None:
        os.kill(os.getpid(), 9)

    with Worker(user, body, timeout=30) as worker, pytest.raises(
            StagingError, match="ended unexpectedly \\(killed by signal 9\\)"):
        worker.recv()


def test_user_ids_for_a_job() -> None:
    ids = UserIds.for_job("root", 0, 0)
    assert (ids.name, ids.uid, ids.gid) == ("root", 0, 0) and 0 in ids.groups
    unknown = UserIds.for_job("", 54321, 54321)
    assert unknown.name == "54321" and unknown.groups == (54321,)
    assert "uid 54321" in unknown.describe()


def test_channel_carries_long_messages_and_descriptors(tmp_path: Path) -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    a, b = Channel(left), Channel(right)
    path = tmp_path / "f"
    path.write_text("through the socket")
    fd = os.open(path, os.O_RDONLY)
    big = {"t": "manifest", "rows": ["x" * 100] * 5000}  # ~0.5 MB: many packets
    sender = threading.Thread(target=a.send, args=(big, [fd]))  # it blocks until read
    sender.start()
    message, fds = b.recv()
    sender.join(10)
    os.close(fd)
    assert message == big
    assert os.pread(fds[0], 100, 0) == b"through the socket"
    os.close(fds[0])
    a.close()
    with pytest.raises(EOFError):
        b.recv()
    b.close()


def test_channel_refuses_garbage() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    left.send(b".not json")
    with pytest.raises(StagingError, match="malformed message"):
        Channel(right).recv()
    left.send(b'.["a list"]')
    with pytest.raises(StagingError, match="malformed message"):
        Channel(right).recv()
    left.close()
    right.close()


def test_channel_deadline() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    waiting = Channel(right, deadline=time.monotonic() + 0.2)
    with pytest.raises(StagingError, match="time budget"):
        waiting.recv()
    left.close()
    right.close()
