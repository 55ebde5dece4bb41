"""Recent Xid events from the kernel log (/dev/kmsg), where the NVIDIA driver reports them.

Why the kernel log and not NVML's event API: NVML delivers an Xid event only to a
process that registered for it before the event happened (nvmlDeviceRegisterEvents +
nvmlEventSetWait), so a probe that lives for the second of a prolog would see nothing.
The driver writes every Xid to the kernel ring buffer as
``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.``, which root can
read back at any time from /dev/kmsg with a timestamp in microseconds since boot; we keep
those of the last ``[gpu] xid_window`` seconds. (A long-lived watcher such as the
supervisor can use the event API instead.)

The kernel log also carries text users choose: a segfault record ends with the name of
the file the fault was in, OOM and segfault records carry the process name (``comm``),
and root may write to /dev/kmsg with any priority. So a record counts only when the
kernel itself wrote it (facility 0, ``kern``) and its message *begins* with the driver's
``NVRM: Xid (`` and a PCI address: a file name or ``comm`` is never at the start of a
kernel record (``comm`` is at most 15 bytes, too short to hold ``NVRM: Xid (PCI:`` and an
address), and user writes to /dev/kmsg get the ``user`` facility. The caller keeps only
the addresses of GPUs the node has.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Iterator

# The address is domain:bus:device, with or without a "PCI:" tag and a function.
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})"
                  r"(?:\.[0-7])?\): (\d+)")


def device_key(pci_bus_id: str) -> str:
    """``0000:3b:00.0`` -> ``0000:3b:00``: the part of a PCI address the Xid lines carry."""
    domain, bus, rest = pci_bus_id.lower().split(":")
    return f"{int(domain, 16):04x}:{bus}:{rest.split('.')[0]}"


KERN = 0  # syslog facility of the kernel's own records (prio = facility << 3 | level)


def parse_record(line: str) -> tuple[float, str] | None:
    """A /dev/kmsg record ``prio,seq,usec,flags[,...];message`` the kernel wrote
    (facility ``kern``) -> (seconds since boot, message); None for continuation lines,
    records written to /dev/kmsg from user space (facility ``user`` and the others), and
    anything else."""
    head, sep, message = line.partition(";")
    if not sep:
        return None
    parts = head.split(",")
    if len(parts) < 3 or not parts[0].isdigit() or not parts[2].isdigit():
        return None
    if int(parts[0]) >> 3 != KERN:
        return None
    return int(parts[2]) / 1e6, message


def parse_xid(message: str) -> tuple[str, int] | None:
    """``NVRM: Xid (PCI:0000:3b:00): 79, ...`` -> (``0000:3b:00``, 79), only where the
    message begins so: the text anywhere else in a record (a file name in a segfault
    record, a process name) is a user's, not the driver's."""
    match = _XID.match(message)
    if not match:
        return None
    domain, bus, device, code = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}", int(code)


def read_records(path: str) -> Iterator[str]:
    """The records of /dev/kmsg (one per read), or the lines of a file in that format."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    pending = b""
    try:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break  # /dev/kmsg: no more records
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records were overwritten while we read; go on from the next
                raise
            if not chunk:
                break  # a regular file: its end
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.decode("utf-8", "replace")
    finally:
        os.close(fd)
    if pending:
        yield pending.decode("utf-8", "replace")


def recent_xids(path: str, window: float, *, now: float | None = None) -> dict[str, list[int]]:
    """Xids of the last ``window`` seconds by device key (see :func:`device_key`), each
    code once, in the order first seen. ``now`` is seconds since boot (CLOCK_MONOTONIC,
    the clock the kernel log's timestamps follow). Raises OSError if ``path`` cannot be
    read."""
    since = (time.monotonic() if now is None else now) - window
    found: dict[str, list[int]] = {}
    for line in read_records(path):
        if "NVRM: Xid (" not in line:
            continue  # most records: no parse
        record = parse_record(line)
        if record is None or record[0] < since:
            continue
        xid = parse_xid(record[1])
        if xid is not None:
            codes = found.setdefault(xid[0], [])
            if xid[1] not in codes:
                codes.append(xid[1])
    return found


def kernel_xids(kmsg_path: str, window: float) -> dict[str, list[int]] | None:
    """:func:`recent_xids`, or None where the kernel log cannot be read."""
    try:
        return recent_xids(kmsg_path, window)
    except OSError:
        # Not root, or a container without the kernel log: the Xid check reports the
        # events as not available rather than failing every other check.
        return None
