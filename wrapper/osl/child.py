"""The one run-as-user engine: a forked child with the job user's rights and nothing more.

``fork_as`` is the engine; ``call_as`` is its one-function form. The child:

1. puts the hook's signal handlers (its time budget, SIGTERM) back to the defaults;
2. closes every descriptor it inherited (the hook's log, root's state files) except
   0-2 and the ones the caller names;
3. drops to the user for good (``users.drop_to``) and marks itself non-dumpable;
4. sets umask 077 and runs the body; any error, before or in the body, goes to
   ``on_error`` (which reports it to the parent) and the child ends with ``os._exit``.

The parent owns the deadline: ``Child.kill`` SIGKILLs the child by its pid and reaps it,
and ``call_as`` does so the moment the deadline passes or the result grows past its
bound, then raises a clear error. ``call_as(..., alarm=seconds)`` also arms an alarm
nobody catches in the child, so a body stuck in the kernel (a read on a hung file system)
ends itself at ``alarm`` seconds, however long the parent's deadline. Without root (tests,
``jobwrap run`` by a user) the same code runs in the caller's own rights; acting as
someone else then needs root.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from wrapper.osl.users import AsUserError, UserIds, drop_to, not_dumpable

EXIT_OK, EXIT_FAILED = 0, 4
DEFAULT_TIMEOUT = 60.0
DEFAULT_MAX_RESULT = 4 << 20


class AsUserTimeout(AsUserError):
    """The child running with the user's rights outlived its deadline and was killed."""


class Child:
    """A forked child running as a user; ``kill`` ends it (by pid) and reaps it."""

    def __init__(self, pid: int, user: UserIds, deadline: float | None) -> None:
        self.pid: int | None = pid
        self.user = user
        self.deadline = deadline  # time.monotonic() after which the child must be gone
        self.status: int | None = None

    def left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def wait(self) -> int:
        """Reap the child (blocking); returns its wait status."""
        if self.pid is None:
            return self.status or 0
        _, status = os.waitpid(self.pid, 0)
        self.pid, self.status = None, status
        return status

    def kill(self) -> None:
        """SIGKILL the child if it still runs, and reap it."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.wait()

    def describe(self) -> str:
        status = self.status or 0
        if os.WIFSIGNALED(status):
            return f"killed by signal {os.WTERMSIG(status)}"
        return f"exit code {os.waitstatus_to_exitcode(status)}"


def fork_as(user: UserIds, body: Callable[[], None], *,
            on_error: Callable[[BaseException], int], keep_fds: Sequence[int] = (),
            timeout: float | None = DEFAULT_TIMEOUT) -> Child:
    """Fork a child that becomes ``user`` for good and runs ``body``; see the module doc."""
    if os.geteuid() != 0 and user.uid != os.geteuid():
        raise AsUserError(f"acting as {user.describe()} needs root; jobwrap runs as uid "
                          f"{os.geteuid()}")
    deadline = time.monotonic() + timeout if timeout is not None else None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child, which always ends in os._exit
        code = EXIT_OK
        try:
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGHUP):
                signal.signal(signum, signal.SIG_DFL)
            close_inherited({0, 1, 2, *keep_fds})
            drop_to(user)
            not_dumpable()
            os.umask(0o077)
            body()
        except BaseException as exc:  # everything, a bug too, must reach the parent
            try:
                code = on_error(exc)
            except BaseException:
                code = EXIT_FAILED
        finally:
            os._exit(code)
    return Child(pid, user, deadline)


def close_inherited(keep: set[int]) -> None:
    """Close every descriptor of this process but ``keep``."""
    low = 0
    for fd in sorted(keep):
        if fd > low:
            os.closerange(low, fd)
        low = max(low, fd + 1)
    os.closerange(low, 1 << 20)


def call_as(user: UserIds, fn: Callable[..., Any], *args: Any,
            timeout: float = DEFAULT_TIMEOUT, max_result: int = DEFAULT_MAX_RESULT,
            keep_fds: Sequence[int] = (), alarm: float | None = None) -> Any:
    """``fn(*args)`` with ``user``'s rights; its result must be JSON-serialisable.

    Runs in-process when this process already is ``user`` (or is not root), and then
    ``alarm`` is not armed: the caller's own process must not be ended. Otherwise a
    child past ``timeout`` seconds, or whose result passes ``max_result`` bytes, is
    killed and reaped, and AsUserTimeout / AsUserError is raised; with ``alarm`` the
    child also ends itself (SIGALRM, left at its default) that many seconds after it
    starts ``fn``, which the parent reports as a helper that died.
    """
    if os.geteuid() != 0 or os.geteuid() == user.uid:
        return fn(*args)
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)

    def body() -> None:
        if alarm is not None:  # fork_as put SIGALRM back to its default: it ends the child
            signal.setitimer(signal.ITIMER_REAL, max(alarm, 0.001))  # 0 would disarm it
        try:
            payload: dict[str, Any] = {"ok": fn(*args)}
        except OSError as exc:
            payload = {"error": f"{exc.strerror}: {exc.filename}" if exc.filename
                       else str(exc)}
        except Exception as exc:
            payload = {"error": str(exc) or type(exc).__name__}
        _write_all(write_fd, json.dumps(payload, default=str).encode())

    def on_error(exc: BaseException) -> int:
        with contextlib.suppress(BaseException):
            _write_all(write_fd, json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
        return EXIT_FAILED

    try:
        child = fork_as(user, body, on_error=on_error, keep_fds=[write_fd, *keep_fds],
                        timeout=timeout)
    finally:
        os.close(write_fd)
    try:
        data = _read_bounded(read_fd, child, max_result)
    finally:
        os.close(read_fd)
        child.kill()
    if not data:
        raise AsUserError(f"the helper process running as {user.name} died "
                          f"({child.describe()})")
    from wrapper.osl import jsontext

    result = jsontext.loads_object(data, max_bytes=max_result)
    if result is None or ("error" not in result and "ok" not in result):
        raise AsUserError(f"the helper process running as {user.name} answered what is "
                          "not a result")
    if "error" in result:
        raise AsUserError(str(result["error"]))
    return result["ok"]


def _read_bounded(fd: int, child: Child, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        left = child.left()
        if left is not None and left <= 0:
            child.kill()
            raise AsUserTimeout(f"the helper process running as {child.user.name} did not "
                                "finish in time; it was killed")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            child.kill()
            raise AsUserError(f"the helper process running as {child.user.name} sent more "
                              f"than {limit} bytes; it was killed")
        chunks.append(chunk)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
