"""Content checks for formats that state their own sizes: headers and directories, never data.

Each check opens one file read-only, non-blocking and without following a symlink (the
caller already resolved the path inside the checkpoint directory; discovery itself runs
with the job user's rights), reads at most a header, and raises Rejected with the reason
when what the header promises is not all there:

- safetensors: an 8-byte little-endian header length, a JSON header whose tensors name
  ``data_offsets`` into the data that follows; complete when 8 + header + the largest
  end offset is the file's size exactly.
- zip (``torch.save``, Lightning ``.ckpt``, ``.bin``): see ziptail (end record, central
  directory inside the file).
- ``.pkl``: a zip when it starts like one (Accelerate's ``random_states_N.pkl`` is a
  ``torch.save`` file), else a plain pickle, whose last byte is its STOP opcode.
- by suffix (``weight_problem``): whichever of those the name says.
"""

from __future__ import annotations

import os
import stat
import struct

from wrapper.checkpoints.layout import Rejected
from wrapper.checkpoints.ziptail import zip_problem
from wrapper.osl import jsontext

_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# safetensors refuses headers above 100,000,000 bytes itself.
SAFETENSORS_HEADER_LIMIT = 100_000_000
_PICKLE_STOP = b"."


def _open(path: str) -> tuple[int, os.stat_result]:
    try:
        fd = os.open(path, _OPEN)
    except FileNotFoundError:
        raise Rejected(f"missing {os.path.basename(path)}") from None
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: a symlink where a file should be
            raise Rejected(f"{os.path.basename(path)} is a symlink: not followed") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise Rejected(f"{os.path.basename(path)} is not a regular file")
    return fd, st


def _read_exact(fd: int, length: int, offset: int) -> bytes:
    chunks = []
    while length > 0:
        chunk = os.pread(fd, min(length, 1 << 24), offset)
        if not chunk:
            break
        chunks.append(chunk)
        length -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def safetensors_problem(fd: int, size: int) -> str | None:
    """Why the safetensors file open on ``fd`` is not complete; None when it is."""
    if size < 8:
        return f"truncated: {size} bytes is too short for a safetensors file"
    (header_len,) = struct.unpack("<Q", _read_exact(fd, 8, 0))
    if header_len > SAFETENSORS_HEADER_LIMIT:
        return f"not a safetensors file: header length {header_len} is implausible"
    if 8 + header_len > size:
        return f"truncated: the header ({header_len} bytes) does not fit in {size} bytes"
    raw = _read_exact(fd, header_len, 8)
    header = jsontext.loads(raw, max_bytes=SAFETENSORS_HEADER_LIMIT)
    if header is None:
        return "corrupt: the safetensors header is not JSON (or nests too deep)"
    if not isinstance(header, dict):
        return "corrupt: the safetensors header is not a JSON object"
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and o >= 0 for o in offsets)
                or offsets[0] > offsets[1]):
            return f"corrupt: tensor {str(name)[:60]!r} has no valid data_offsets"
        end = max(end, offsets[1])
    expected = 8 + header_len + end
    if expected > size:
        return f"truncated: {size} bytes, the header promises {expected}"
    if expected < size:
        return f"corrupt: {size} bytes, the header accounts for {expected}"
    return None


def check_file(path: str) -> float:
    """Check one weight or state file by what its name says it is; returns its mtime."""
    fd, st = _open(path)
    try:
        problem = _problem_by_name(os.path.basename(path), fd, st.st_size)
    finally:
        os.close(fd)
    if problem:
        raise Rejected(f"{os.path.basename(path)}: {problem}")
    return st.st_mtime


def _problem_by_name(name: str, fd: int, size: int) -> str | None:
    if name.endswith(".safetensors"):
        return safetensors_problem(fd, size)
    if name.endswith((".pt", ".pth", ".bin", ".ckpt")):
        return zip_problem(fd, size)
    if name.endswith(".pkl"):
        if size == 0:
            return "empty file"
        if _read_exact(fd, 4, 0) == b"PK\x03\x04":  # Accelerate saves it with torch.save
            return zip_problem(fd, size)
        return None if _read_exact(fd, 1, size - 1) == _PICKLE_STOP else \
            "truncated: a pickle that does not end with its STOP opcode"
    return None if size > 0 else "empty file"


def file_size(path: str) -> int:
    """The size of a regular file (no symlink followed); Rejected when it is not one."""
    fd, st = _open(path)
    os.close(fd)
    return st.st_size


def read_small(path: str, limit: int) -> bytes:
    """The whole of a small file (JSON index, pickle metadata), refusing one over ``limit``."""
    fd, st = _open(path)
    try:
        if st.st_size > limit:
            raise Rejected(f"{os.path.basename(path)} is larger than {limit} bytes")
        return _read_exact(fd, st.st_size, 0)
    finally:
        os.close(fd)


def plain_name(name: object) -> bool:
    """A name inside the checkpoint folder: no path separator, not . or .., not empty."""
    return (isinstance(name, str) and bool(name) and "/" not in name and "\0" not in name
            and name not in (".", ".."))
