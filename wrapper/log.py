"""Structured logs: JSON lines to a file, and a stderr line fit for a terminal or journald.

Configured only by the entry point (never at import). Every event carries the context
bound with :func:`bind` (hook, job_id, node, attempt).

The pipeline is structlog's (bound context, level filter, ISO UTC timestamp, formatted
exception, then our sinks) written out here in a few lines, because importing structlog
itself pulls in asyncio and ssl (its loggers are async-capable): well over half the
prolog's import time, on the start path of every job. structlog is still what renders
the ``console`` form, and what :func:`get` returns in a process that never called
:func:`configure` (structlog's defaults, as before; tests capture it with
``structlog.testing``). :func:`reset` returns to that state.
"""

from __future__ import annotations

import contextvars
import json
import os
import stat
import sys
from collections.abc import Callable, MutableMapping
from typing import Any, TextIO

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
# Method name -> (level value, the level an event is shown with), as structlog's.
_METHODS = {**{name: (value, name) for name, value in _LEVELS.items()},
            "warn": (30, "warning"), "exception": (40, "error"), "fatal": (50, "critical"),
            "msg": (20, "info")}

_context: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("jobwrap_log")
_sinks: _Sinks | None = None  # None: not configured, get() is structlog's
_min_level = 20


def bind(**context: Any) -> None:
    """Attach context (hook, job_id, node, attempt, ...) to every later event."""
    _context.set({**_context.get({}), **{k: v for k, v in context.items() if v is not None}})


def reset() -> None:
    """Forget the configuration and the bound context (tests: one clean log per test)."""
    global _sinks
    _sinks = None
    _context.set({})


class _Sinks:
    """The end of the pipeline: renders each event once per sink and writes it there."""

    def __init__(self, file: TextIO | None, stderr: TextIO, stderr_format: str,
                 max_bytes: int = 0, to_syslog: bool = False) -> None:
        self.file = file
        self.to_syslog = to_syslog  # the log file was wanted and cannot be written
        self.max_bytes = max_bytes  # 0: no cap
        self.size = os.fstat(file.fileno()).st_size if file is not None and max_bytes else 0
        self.stderr = stderr
        self.stderr_format = stderr_format
        self._console: Callable[[Any, str, dict[str, Any]], Any] | None = None
        if stderr_format == "console":  # a terminal: worth structlog's import
            import structlog.dev

            self._console = structlog.dev.ConsoleRenderer(colors=False)

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> None:
        if self.file is not None:
            line = json.dumps(event, default=str) + "\n"
            if self.max_bytes and self.size + len(line) > self.max_bytes:
                line = json.dumps({"event": "log.capped", "max_bytes": self.max_bytes,
                                   "timestamp": event.get("timestamp")}) + "\n"
            try:
                self.file.write(line)
                self.file.flush()
            except OSError:
                self.file = None
            self.size += len(line)
            if self.max_bytes and self.size > self.max_bytes:
                self.file = None  # capped: nothing more is written
        if self.to_syslog:  # syslog adds jobwrap[PID] itself
            _syslog(str(event.get("level", "info")), _logfmt(event).split(" ", 1)[1])
        if self.stderr_format == "json":
            line = json.dumps(event, default=str)
        elif self._console is not None:
            line = str(self._console(logger, method, dict(event)))
        else:
            line = _logfmt(event)
        try:
            self.stderr.write(line + "\n")
            self.stderr.flush()
        except (OSError, ValueError):
            pass


def _syslog(level: str, line: str) -> None:
    """One line to syslog (journald reads /dev/log): where a root process logs when its
    log file cannot be written, since slurmd keeps no hook's stderr."""
    import syslog

    priority = {"debug": syslog.LOG_DEBUG, "warning": syslog.LOG_WARNING,
                "error": syslog.LOG_ERR, "critical": syslog.LOG_CRIT}.get(level, syslog.LOG_INFO)
    syslog.openlog("jobwrap", syslog.LOG_PID, syslog.LOG_DAEMON)
    syslog.syslog(priority, line)


LOG_FOLDER_MODE = 0o750  # the folder root's processes make for [log] file when it is missing


class LogFileError(OSError):
    """The log file's folder is not one root may write into (one line, says why)."""


def open_log_file(path: str) -> int:
    """Open ``path`` for appending (0640), never through a symlink, and return its fd.

    As root, the file's folder must be a real directory owned by root that others cannot
    write (else a user who controls it could point root's appends at another file); a
    folder that is missing is made (root's, LOG_FOLDER_MODE), when its own parent is
    root's and not writable by others: /var/log/jobwrap on a node where nothing made it.
    """
    folder, name = os.path.split(os.path.abspath(path))
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    root = os.geteuid() == 0
    try:
        dir_fd = os.open(folder, flags)
    except FileNotFoundError:
        if not root:
            raise
        dir_fd = _make_folder(folder, flags)
    except OSError:
        if os.path.islink(folder):
            raise LogFileError(f"its folder {folder} is a symlink; root writes its log only "
                               "into a real directory") from None
        raise
    try:
        if root:
            info = os.fstat(dir_fd)
            if info.st_uid != 0 or info.st_mode & 0o002 or (
                    info.st_mode & 0o020 and info.st_gid != 0):
                raise LogFileError(f"its folder {folder} is "
                                   + (f"owned by uid {info.st_uid}, not root"
                                      if info.st_uid != 0 else "writable by others"))
        # Non-blocking, then checked: a FIFO in its place must not hang a hook.
        fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                     | os.O_CLOEXEC | os.O_NONBLOCK, 0o640, dir_fd=dir_fd)
        file = os.fstat(fd)
        if not stat.S_ISREG(file.st_mode) or (root and (file.st_uid != 0 or file.st_nlink != 1)):
            os.close(fd)
            raise LogFileError(f"{path} is not a regular file of root's alone")
        os.set_blocking(fd, True)
        return fd
    finally:
        os.close(dir_fd)


def _make_folder(folder: str, flags: int) -> int:
    parent, base = os.path.split(folder)
    parent_fd = os.open(parent or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        info = os.fstat(parent_fd)
        if info.st_uid != 0 or info.st_mode & 0o002:
            raise LogFileError(f"its folder {folder} is missing, and {parent} is not root's "
                               "alone to make it in")
        try:
            os.mkdir(base, LOG_FOLDER_MODE, dir_fd=parent_fd)
            made = True
        except FileExistsError:
            made = False  # another hook made it meanwhile: checked as any folder is
        fd = os.open(base, flags, dir_fd=parent_fd)
        if made:  # whatever the umask and the parent's group
            os.fchown(fd, 0, 0)
            os.fchmod(fd, LOG_FOLDER_MODE)
        return fd
    finally:
        os.close(parent_fd)


def _logfmt(event: MutableMapping[str, Any]) -> str:
    head = f"jobwrap[{os.getpid()}] {event.get('level', 'info')}: {event.get('event', '')}"
    rest = []
    for key, value in event.items():
        if key in ("level", "event", "timestamp"):
            continue
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        if not text or any(c in text for c in ' "=\n'):
            text = json.dumps(text)
        rest.append(f"{key}={text}")
    return " ".join([head, *rest])


def _timestamp() -> str:
    from datetime import UTC, datetime

    return datetime.now(tz=UTC).isoformat().replace("+00:00", "Z")


def _exception_text(exc_info: Any) -> str | None:
    """An ``exc_info`` value (True, an exception, a sys.exc_info() tuple) as its traceback."""
    if isinstance(exc_info, BaseException):
        exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
    elif not (isinstance(exc_info, tuple) and len(exc_info) == 3):
        exc_info = sys.exc_info() if exc_info else None
    if not exc_info or exc_info[0] is None:
        return None
    import traceback

    text = "".join(traceback.format_exception(*exc_info))
    return text[:-1] if text.endswith("\n") else text


class _Logger:
    """The few methods jobwrap logs with, as structlog's filtering bound logger has them."""

    def __init__(self, context: dict[str, Any]) -> None:
        self._bound = context

    def bind(self, **context: Any) -> _Logger:
        return _Logger({**self._bound, **context})

    def __getattr__(self, method: str) -> Callable[..., None]:
        if method not in _METHODS:
            raise AttributeError(method)
        value, level = _METHODS[method]

        def emit(event: str, *args: Any, **kw: Any) -> None:
            if value < _min_level or _sinks is None:
                return
            if method == "exception":
                kw.setdefault("exc_info", True)
            if args:
                event = event % (args[0] if len(args) == 1 and isinstance(args[0], dict)
                                 and args[0] else args)
            # Key order as structlog's: bound, the call's, event, context, level, time.
            record: dict[str, Any] = {**self._bound, **kw, "event": event}
            for key, bound in _context.get({}).items():
                record.setdefault(key, bound)
            record["level"] = level
            record["timestamp"] = _timestamp()
            if "exc_info" in record:
                text = _exception_text(record.pop("exc_info"))
                if text is not None:
                    record["exception"] = text
            _sinks(self, method, record)

        return emit


def configure(*, file: str = "", level: str = "info", stderr_format: str = "auto",
              stderr: TextIO | None = None, file_fd: int | None = None,
              max_bytes: int = 0) -> None:
    """Set up logging for this process. A log file we cannot open is not fatal.

    ``file_fd``: an already open log (root opened it before dropping rights), used in
    place of ``file``. ``max_bytes``: past it one ``log.capped`` line is written, then
    nothing more.
    """
    global _sinks, _min_level
    err = stderr if stderr is not None else sys.stderr
    if stderr_format == "auto":
        stderr_format = "console" if err.isatty() else "logfmt"
    sink_file: TextIO | None = None
    problem = None
    if file_fd is not None:
        sink_file = os.fdopen(file_fd, "a", encoding="utf-8")
    elif file:
        try:
            sink_file = os.fdopen(open_log_file(file), "a", encoding="utf-8")
        except LogFileError as exc:
            problem = f"{file}: {exc}"
        except OSError as exc:
            problem = f"{file}: {exc.strerror or exc}"
    _sinks = _Sinks(sink_file, err, stderr_format, max_bytes, to_syslog=problem is not None)
    _min_level = _LEVELS.get(level, 20)
    if problem:
        get().warning("log.file_unavailable", detail=problem,
                      action="logging to syslog (the journal) instead; `jobwrap doctor` "
                             "says how to fix the log folder")


def get(name: str = "jobwrap") -> Any:
    if _sinks is None:
        import structlog

        return structlog.get_logger(name)
    return _Logger({})
