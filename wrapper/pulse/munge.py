"""MUNGE credentials in-process (libmunge through ctypes), for root-to-root messages.

Every Slurm site runs munged: a credential it encodes carries the encoding process's uid
and gid, which the decoding side learns from munged, not from the message. A user can
make credentials of their own uid only, and munged refuses to decode one credential
twice (a replay). That is what lets two root processes on two nodes trust each other
without a port of their own or a key of jobwrap's (see wrapper/pulse/).

One encode or decode is one round trip to the node's munged over its Unix socket (about
a tenth of a millisecond); the pulse needs one of each per connection, not per beat.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from typing import Any

from wrapper.errors import JobwrapError

LIBRARY = "libmunge.so.2"
EMUNGE_CRED_REPLAYED = 17  # munge.h: the credential was decoded before


class MungeError(JobwrapError):
    """munged refused (or could not be asked)."""


class Credential:
    """What a decoded credential says: the payload and who encoded it."""

    __slots__ = ("gid", "payload", "uid")

    def __init__(self, payload: bytes, uid: int, gid: int) -> None:
        self.payload, self.uid, self.gid = payload, uid, gid


_lock = threading.Lock()
_lib: Any = None
_libc: Any = None


def _load() -> tuple[Any, Any]:
    global _lib, _libc
    with _lock:
        if _lib is None:
            try:
                lib = ctypes.CDLL(LIBRARY)
            except OSError as exc:
                raise MungeError(f"cannot load {LIBRARY} ({exc}): install munge's library "
                                 "(Debian: libmunge2), which every Slurm node has") from None
            lib.munge_encode.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p,
                                         ctypes.c_void_p, ctypes.c_int]
            lib.munge_encode.restype = ctypes.c_int
            lib.munge_decode.argtypes = [ctypes.c_char_p, ctypes.c_void_p,
                                         ctypes.POINTER(ctypes.c_void_p),
                                         ctypes.POINTER(ctypes.c_int),
                                         ctypes.POINTER(ctypes.c_uint32),
                                         ctypes.POINTER(ctypes.c_uint32)]
            lib.munge_decode.restype = ctypes.c_int
            lib.munge_strerror.argtypes = [ctypes.c_int]
            lib.munge_strerror.restype = ctypes.c_char_p
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            libc.free.argtypes = [ctypes.c_void_p]
            libc.free.restype = None
            _lib, _libc = lib, libc
    return _lib, _libc


def _error(lib: Any, code: int, what: str) -> MungeError:
    text = lib.munge_strerror(code)
    return MungeError(f"munge {what}: {text.decode(errors='replace') if text else code}")


def encode(payload: bytes) -> bytes:
    """A credential for ``payload``, signed as this process's uid and gid."""
    lib, libc = _load()
    cred = ctypes.c_char_p()
    buf = ctypes.create_string_buffer(payload, len(payload))
    code = lib.munge_encode(ctypes.byref(cred), None, buf, len(payload))
    try:
        if code != 0:
            raise _error(lib, code, "encode")
        return bytes(cred.value or b"")
    finally:
        if cred:
            libc.free(ctypes.cast(cred, ctypes.c_void_p))


def decode(cred: bytes) -> Credential:
    """The payload and the encoder's uid and gid; a forged, expired or replayed credential
    raises :class:`MungeError`."""
    lib, libc = _load()
    out = ctypes.c_void_p()
    length, uid, gid = ctypes.c_int(0), ctypes.c_uint32(0), ctypes.c_uint32(0)
    code = lib.munge_decode(cred, None, ctypes.byref(out), ctypes.byref(length),
                            ctypes.byref(uid), ctypes.byref(gid))
    try:
        if code != 0:
            raise _error(lib, code, "decode")
        payload = ctypes.string_at(out, length.value) if out and length.value > 0 else b""
        return Credential(payload, uid.value, gid.value)
    finally:
        if out:
            libc.free(out)
