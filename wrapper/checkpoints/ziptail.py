"""Tells a complete zip archive (every ``torch.save`` file) from a cut one by its tail alone.

A zip archive ends with an end-of-central-directory record (EOCD, 22 bytes plus a
comment of at most 65,535 bytes) that points back at the central directory; a writer
puts both there last, so a file cut anywhere before its end has no EOCD aligned with the
end of the file. Reading at most the last 64 KiB + 22 bytes (plus two tiny reads to
confirm what the EOCD points at) keeps this to microseconds on multi-gigabyte files.
PyTorch always writes the ZIP64 records (miniz's MZ_ZIP_FLAG_WRITE_ZIP64), so those
are followed whenever their locator sits before the EOCD.
"""

from __future__ import annotations

import os
import struct

_EOCD = b"PK\x05\x06"
_EOCD_SIZE = 22
_MAX_COMMENT = 65535
_TAIL = _MAX_COMMENT + _EOCD_SIZE
_LOCATOR = b"PK\x06\x07"
_LOCATOR_SIZE = 20
_ZIP64_EOCD = b"PK\x06\x06"
_ZIP64_EOCD_SIZE = 56
_CENTRAL_HEADER = b"PK\x01\x02"
_LOCAL_HEADER = b"PK\x03\x04"


def zip_problem(fd: int, size: int) -> str | None:
    """Why the zip archive open on ``fd`` (``size`` bytes) is not complete; None when it is."""
    if size == 0:
        return "empty file"
    if size < _EOCD_SIZE:
        return f"truncated: {size} bytes is too short for a zip archive"
    tail_len = min(size, _TAIL)
    tail_at = size - tail_len
    tail = os.pread(fd, tail_len, tail_at)
    if len(tail) != tail_len:
        return "changed while being checked: shorter than its size"
    pos = tail.rfind(_EOCD)
    while pos >= 0:
        # The real EOCD's comment ends exactly at the end of the file; a stray signature in
        # the data or the comment does not.
        if pos + _EOCD_SIZE <= tail_len:
            comment_len = struct.unpack_from("<H", tail, pos + 20)[0]
            if pos + _EOCD_SIZE + comment_len == tail_len:
                return _check_eocd(fd, size, tail, tail_at, pos)
        pos = tail.rfind(_EOCD, 0, pos)
    if os.pread(fd, 4, 0) == _LOCAL_HEADER:
        return "truncated: no zip end-of-central-directory record"
    return ("not a zip archive (a legacy torch.save file or another format): "
            "cannot tell whether it is complete")


def _read(fd: int, tail: bytes, tail_at: int, offset: int, length: int) -> bytes:
    if offset >= tail_at:
        return tail[offset - tail_at:offset - tail_at + length]
    return os.pread(fd, length, offset)


def _check_eocd(fd: int, size: int, tail: bytes, tail_at: int, pos: int) -> str | None:
    eocd_at = tail_at + pos
    (_sig, disk, cd_disk, entries_here, entries, cd_size, cd_offset,
     _comment) = struct.unpack_from("<4s4H2LH", tail, pos)
    cd_limit = eocd_at  # the central directory must end before this offset
    locator_at = eocd_at - _LOCATOR_SIZE
    if locator_at >= 0:
        locator = _read(fd, tail, tail_at, locator_at, _LOCATOR_SIZE)
        if locator[:4] == _LOCATOR:
            _sig, _disk, z64_at, _disks = struct.unpack("<4sLQL", locator)
            if z64_at + _ZIP64_EOCD_SIZE > locator_at:
                return (f"truncated: ZIP64 end record offset {z64_at} does not fit before its "
                        f"locator at {locator_at}")
            record = _read(fd, tail, tail_at, z64_at, _ZIP64_EOCD_SIZE)
            if len(record) != _ZIP64_EOCD_SIZE or record[:4] != _ZIP64_EOCD:
                return f"truncated: no ZIP64 end record at offset {z64_at}"
            (_sig, _rec_size, _made_by, _needed, disk, cd_disk, entries_here, entries,
             cd_size, cd_offset) = struct.unpack("<4sQ2H2L4Q", record)
            cd_limit = z64_at
    if disk != 0 or cd_disk != 0 or entries_here != entries:
        return "a multi-disk zip archive: not a checkpoint"
    if entries == 0:
        return "a zip archive with no entries"
    if cd_offset + cd_size > cd_limit:
        return (f"truncated: central directory (offset {cd_offset}, size {cd_size}) does not "
                f"fit before the end record at {cd_limit} in {size} bytes")
    if _read(fd, tail, tail_at, cd_offset, 4) != _CENTRAL_HEADER:
        return f"corrupt: no central directory where the end record points (offset {cd_offset})"
    return None
