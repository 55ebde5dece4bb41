"""Root's facts: what the epilog decides from, and nothing the job's user could forge.

The job's state folder holds two kinds of records. ``events.jsonl`` is written by root
alone; ``user-events.jsonl`` is the job user's own file, and anything in it (a
``prolog.unhealthy``, a ``gpu.fault``, a ``hang``) is only what the user *says*. The
supervisor runs with the user's rights too, so what it writes there is no better.

So the decision reads:

- root's own events (``root_events``), never the user's;
- the supervisor's reports of what it acted on (a hang it ended the job for, a GPU fault
  it saw) from ``supervisor-facts.jsonl``: root opens that file (root-owned, mode 0600)
  *before* the supervisor drops its rights, and the supervisor keeps only the write-only
  descriptor. A process whose uid changed from root is not dumpable, so the job's user
  can neither open the file nor reach that descriptor (``/proc/PID/fd``, ptrace);
- a reported GPU fault counts as hardware only once root's own probe of the job's GPUs
  confirms it (``wrapper.gpu.faults.confirm``), never on the supervisor's or the output's word.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import time
from collections.abc import Iterable
from typing import Any

from wrapper.errors import StateError
from wrapper.job.events import FACT_KINDS
from wrapper.job.paths import SUPERVISOR_FACTS
from wrapper.job.state import JobState
from wrapper.osl.files import owned_alone

# The supervisor's reports the epilog acts on; each also goes to the user's event file
# (for ``jobwrap status``), where it is only a claim.
FACT_EVENTS = FACT_KINDS
MAX_READ = 1 << 20  # the facts are a few lines per attempt; read at most this, from the end


class FactChannel:
    """The supervisor's write-only, root-owned report file, opened before the drop."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def open(cls, state: JobState) -> FactChannel | None:
        """Open (creating) the job's facts file as root; None when not root."""
        if os.geteuid() != 0:
            return None
        path = state.path / SUPERVISOR_FACTS
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                         | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StateError(f"cannot open {path}: {exc.strerror}") from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != 0 or info.st_nlink != 1:
            os.close(fd)
            raise StateError(f"{path} is not a regular root-owned file; refusing it")
        os.fchmod(fd, 0o600)
        return cls(fd)

    def write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, default=str, separators=(",", ":")) + "\n").encode()
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(self.fd, view):]
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self.fd)



def root_events(state: JobState) -> list[dict[str, Any]]:
    """The job's events that root wrote, in time order."""
    return state.events(root_only=True)


def user_claims(state: JobState, attempt: int) -> list[dict[str, Any]]:
    """What the user's side wrote for ``attempt`` (reports to re-verify, never facts)."""
    return [e for e in state.events() if e.get("source") != "root"
            and e.get("attempt") == attempt]


def supervisor_facts(state: JobState, attempt: int) -> tuple[str, ...]:
    """The supervisor's reports for ``attempt`` through its root-owned channel."""
    path = state.path / SUPERVISOR_FACTS
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ()
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or not owned_alone(info):
            return ()
        os.lseek(fd, max(0, info.st_size - MAX_READ), os.SEEK_SET)
        data = os.read(fd, MAX_READ)
    finally:
        os.close(fd)
    return tuple(str(r["event"]) for r in _records(data.splitlines(), path)
                 if r.get("attempt") == attempt and r.get("event") in FACT_EVENTS)


def _records(lines: Iterable[bytes], path: object) -> Iterable[dict[str, Any]]:
    """The lines as records; one of a newer format than root's events raises FormatTooNew
    (the channel is root's: nothing the user wrote, so nothing to skip)."""
    from wrapper.errors import format_of
    from wrapper.job.state import EVENTS_FORMAT, FORMAT_KEY
    from wrapper.osl import jsontext

    for raw in lines:
        record = jsontext.loads_object(raw)
        if record is not None:
            if FORMAT_KEY in record:
                format_of(record, FORMAT_KEY, known=EVENTS_FORMAT, path=path,
                          what="event line")
            yield record


def fact(name: str, attempt: int, **data: object) -> dict[str, Any]:
    return {"ts": time.time(), "event": name, "attempt": attempt, **data}

