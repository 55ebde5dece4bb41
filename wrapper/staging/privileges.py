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
  cached data there (``Cache.place``, or ``Cache.fill`` with a ``Placement``, which links
  each file as soon as it is cached): through descriptors, folder by folder with
  ``O_NOFOLLOW``, every name new (``O_EXCL``, ``link``), folders handed to the user once
  full. Archives are parsed by the worker alone: root never parses user data.
* The worker (``wrapper.osl.child.fork_as``) marks itself non-dumpable
  (``PR_SET_DUMPABLE`` 0), so the user's other
  processes cannot ptrace it or open its ``/proc/<pid>/fd``: what it sends root is what
  jobwrap's code computed, not what the user injected. It closes every descriptor it
  inherited except the ones it was given, and only JSON crosses the socket.
* Without root (``jobwrap run`` by a user, tests) the same worker runs with the
  caller's own rights; staging for another user then needs root and is refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from wrapper.errors import UserInputError
from wrapper.osl.child import Child, fork_as
from wrapper.osl.users import AsUserError
from wrapper.osl.users import UserIds as UserIds  # the one identity record, re-exported
from wrapper.osl.users import drop_to as _drop_to
from wrapper.osl.users import not_dumpable as _not_dumpable
from wrapper.staging.channel import Channel
from wrapper.staging.errors import StagingError

_EXIT_USER, _EXIT_INTERNAL = 3, 4


def drop_to(user: UserIds) -> None:
    """Become ``user`` for good, and not dumpable (wrapper.osl.users)."""
    try:
        _drop_to(user)
        _not_dumpable()
    except AsUserError as exc:
        raise StagingError(str(exc)) from None


class Worker:
    """A child (``wrapper.osl.child.fork_as``) that runs ``body(channel)`` as the user.

    The parent talks to it through ``channel`` (``recv`` raises the child's error, as
    UserInputError when it was the user's input; waiting past ``timeout`` is an error).
    Use as a context manager: leaving kills a child still running (by pid) and reaps it.
    """

    def __init__(self, user: UserIds, body: Callable[[Channel], None], *,
                 keep_fds: Sequence[int] = (), timeout: float | None = None) -> None:
        import socket

        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        theirs = Channel(child)

        def run() -> None:  # pragma: no cover - runs in the child
            body(theirs)

        def report(exc: BaseException) -> int:  # pragma: no cover - runs in the child
            user_input = isinstance(exc, UserInputError)
            text = str(exc) if user_input else f"{type(exc).__name__}: {exc}"
            with contextlib.suppress(Exception):
                theirs.send({"t": "error", "kind": "user" if user_input else "internal",
                             "message": text})
            return _EXIT_USER if user_input else _EXIT_INTERNAL

        try:
            self.child: Child = fork_as(user, run, on_error=report,
                                        keep_fds=[child.fileno(), *keep_fds], timeout=timeout)
        except AsUserError as exc:
            parent.close()
            child.close()
            raise StagingError(f"staging as {user.describe()}: {exc}") from None
        finally:
            child.close()
        self.channel = Channel(parent, deadline=self.child.deadline)

    @property
    def pid(self) -> int | None:
        return self.child.pid

    def recv(self) -> tuple[dict[str, Any], list[int]]:
        import os

        try:
            message, fds = self.channel.recv()
        except EOFError:
            self.child.wait()
            raise StagingError(f"the staging worker ended unexpectedly "
                               f"({self.child.describe()})") from None
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
        return self.child.wait()

    def close(self) -> None:
        self.child.kill()
        self.channel.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
