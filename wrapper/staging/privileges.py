"""The job user's rights: who the user is, and a forked worker that holds only them.

Why a worker process, and why the open-descriptor hand-over (the design):

* Everything that reads the user's sources or writes the user's outputs runs in a child
  forked from the hook that drops, for good, to the user's uid, gid and supplementary
  groups (``setgroups(getgrouplist())``, ``setresgid``, ``setresuid``; then proves it
  cannot get root back). The kernel then applies the user's rights to every path, on
  every file system (root_squash NFS included), and a symlink planted by the user can
  only lead somewhere the user could go anyway. Root never opens a path the user
  controls by name.
* The node cache must be owned by root so that no job can alter what the next job
  reads. The worker opens the source files with the user's rights and passes the open
  descriptors to root over a socketpair (SCM_RIGHTS); root copies from those into the
  cache. Root thus reads exactly what the user was allowed to read, and the user
  never holds a descriptor to a cache file that could be written. (The other way
  round, a user-side process writing the cache, would let one job poison what the next
  job, maybe another user's, reads.)
* Root writes into the user's scratch at one place only, when it links (or copies)
  cached data there (``Cache.place``): through descriptors, folder by folder with
  ``O_NOFOLLOW``, every name new (``O_EXCL``, ``link``), folders handed to the user once
  full. Archives are parsed by the worker alone: root never parses user data.
* The worker marks itself non-dumpable (``PR_SET_DUMPABLE`` 0), so the user's other
  processes cannot ptrace it or open its ``/proc/<pid>/fd``: what it sends root is what
  jobwrap's code computed, not what the user injected. It closes every descriptor it
  inherited except the ones it was given, and only JSON crosses the socket.
* Without root (``jobwrap run`` by a user, tests) the same worker runs with the
  caller's own rights; staging for another user then needs root and is refused.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from wrapper.errors import UserInputError
from wrapper.privileges import AsUserError
from wrapper.privileges import UserIds as UserIds  # the one identity record, re-exported
from wrapper.privileges import drop_to as _drop_to
from wrapper.staging.channel import Channel
from wrapper.staging.errors import StagingError

_PR_SET_DUMPABLE = 4
_PR_GET_DUMPABLE = 3
_EXIT_USER, _EXIT_INTERNAL = 3, 4


def drop_to(user: UserIds) -> None:
    """Become ``user`` for good (wrapper.privileges.drop_to), and not dumpable."""
    try:
        _drop_to(user)
    except AsUserError as exc:
        raise StagingError(str(exc)) from None
    not_dumpable()


def not_dumpable() -> None:
    """Keep the user's other processes from ptrace or /proc/<pid>/fd of this one."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 or libc.prctl(_PR_GET_DUMPABLE, 0, 0,
                                                                    0, 0) != 0:
        raise StagingError("could not mark the staging worker non-dumpable")


class Worker:
    """A forked child that runs ``body(channel)`` with the user's rights.

    The parent talks to it through ``channel`` (``recv`` raises the child's error, as
    UserInputError when it was the user's input). Use as a context manager: leaving
    kills a child still running and reaps it.
    """

    def __init__(self, user: UserIds, body: Callable[[Channel], None], *,
                 keep_fds: Sequence[int] = (), timeout: float | None = None) -> None:
        if os.geteuid() != 0 and user.uid != os.geteuid():
            raise StagingError(f"staging as {user.describe()} needs root; jobwrap runs as "
                               f"uid {os.geteuid()}")
        deadline = time.monotonic() + timeout if timeout is not None else None
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child, which ends with os._exit
            parent.close()
            _run_child(user, body, child, keep_fds)
        child.close()
        self.pid: int | None = pid
        self.channel = Channel(parent, deadline=deadline)
        self.status: int | None = None

    def recv(self) -> tuple[dict[str, Any], list[int]]:
        try:
            message, fds = self.channel.recv()
        except EOFError:
            code = self.wait()
            raise StagingError(f"the staging worker ended unexpectedly ({_describe(code)})") \
                from None
        if message["t"] == "error":
            for fd in fds:
                os.close(fd)
            text = str(message.get("message", ""))[:4000]
            if message.get("kind") == "user":
                raise UserInputError(text)
            raise StagingError(f"the staging worker failed: {text}")
        return message, fds

    def send(self, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
        self.channel.send(message, fds)

    def wait(self) -> int:
        """Reap the child; returns its wait status."""
        if self.pid is None:
            return self.status or 0
        _, status = os.waitpid(self.pid, 0)
        self.pid, self.status = None, status
        return status

    def close(self) -> None:
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.wait()
        self.channel.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _run_child(user: UserIds, body: Callable[[Channel], None], sock: socket.socket,
               keep_fds: Sequence[int]) -> None:  # pragma: no cover - child process
    code = 0
    channel = Channel(sock)
    try:
        # The hook's own handlers (its time budget) must not run in the child.
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        _close_inherited({0, 1, 2, sock.fileno(), *keep_fds})
        drop_to(user)
        os.umask(0o077)
        body(channel)
    except UserInputError as exc:
        code = _EXIT_USER
        _report(channel, "user", str(exc))
    except BaseException as exc:  # everything, even a bug, must reach the parent
        code = _EXIT_INTERNAL
        _report(channel, "internal", f"{type(exc).__name__}: {exc}")
    finally:
        os._exit(code)


def _report(channel: Channel, kind: str, message: str) -> None:  # pragma: no cover - child
    with contextlib.suppress(Exception):
        channel.send({"t": "error", "kind": kind, "message": message})


def _close_inherited(keep: set[int]) -> None:  # pragma: no cover - child process
    """Close every descriptor the hook had open (its log, its state) but ``keep``."""
    low = 0
    for fd in sorted(keep):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"
