"""Structured logs: JSON lines to a file, and a stderr line fit for a terminal or journald.

Configured only by the entry point (never at import). Every event carries the context
bound with :func:`bind` (hook, job_id, node, attempt) through structlog's contextvars.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


def bind(**context: Any) -> None:
    """Attach context (hook, job_id, node, attempt, ...) to every later event."""
    structlog.contextvars.bind_contextvars(**{k: v for k, v in context.items() if v is not None})


class _Sinks:
    """The final processor: renders each event once per sink and writes it there."""

    def __init__(self, file: TextIO | None, stderr: TextIO, stderr_format: str,
                 max_bytes: int = 0) -> None:
        self.file = file
        self.max_bytes = max_bytes  # 0: no cap
        self.size = os.fstat(file.fileno()).st_size if file is not None and max_bytes else 0
        self.stderr = stderr
        self.stderr_format = stderr_format
        self._console = structlog.dev.ConsoleRenderer(colors=False) \
            if stderr_format == "console" else None

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> Any:
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
        raise structlog.DropEvent


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


def configure(*, file: str = "", level: str = "info", stderr_format: str = "auto",
              stderr: TextIO | None = None, file_fd: int | None = None,
              max_bytes: int = 0) -> None:
    """Set up structlog for this process. A log file we cannot open is not fatal.

    ``file_fd``: an already open log (root opened it before dropping rights), used in
    place of ``file``. ``max_bytes``: past it one ``log.capped`` line is written, then
    nothing more.
    """
    err = stderr if stderr is not None else sys.stderr
    if stderr_format == "auto":
        stderr_format = "console" if err.isatty() else "logfmt"
    sink_file: TextIO | None = None
    problem = None
    if file_fd is not None:
        sink_file = os.fdopen(file_fd, "a", encoding="utf-8")
    elif file:
        try:
            fd = os.open(file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o640)
            sink_file = os.fdopen(fd, "a", encoding="utf-8")
        except OSError as exc:
            problem = f"{file}: {exc.strerror}"
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _Sinks(sink_file, err, stderr_format, max_bytes),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, 20)),
        cache_logger_on_first_use=False,
    )
    if problem:
        structlog.get_logger().warning("log.file_unavailable", detail=problem)


def get(name: str = "jobwrap") -> Any:
    return structlog.get_logger(name)
