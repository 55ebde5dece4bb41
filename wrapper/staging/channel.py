"""JSON messages, with open file descriptors riding along, between the hook and its worker.

A ``SOCK_SEQPACKET`` socketpair keeps message boundaries; a message longer than one
packet (a manifest of 20,000 files) is sent as several, each marked "more" or "last".
Descriptors travel as SCM_RIGHTS on the last packet. Only JSON crosses: the side that
runs as root never unpickles what a user-side process sent.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from wrapper.osl import jsontext
from wrapper.staging.errors import StagingError

_PACKET = 32 * 1024  # well under the default socket buffer, so one send never blocks long
_MAX_MESSAGE = 256 * 1024 * 1024
MAX_FDS = 200  # SCM_MAX_FD is 253 per message
_MORE, _LAST = b"+", b"."


class Channel:
    """One end of the socketpair. ``send`` is thread-safe (the copy threads report)."""

    def __init__(self, sock: socket.socket, *, deadline: float | None = None) -> None:
        self.sock = sock
        self.deadline = deadline  # time.monotonic() after which waiting is an error
        self._send_lock = threading.Lock()

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
        if len(fds) > MAX_FDS:
            raise ValueError(f"at most {MAX_FDS} descriptors per message")
        data = json.dumps(message, separators=(",", ":")).encode()
        chunks = [data[i:i + _PACKET] for i in range(0, len(data), _PACKET)] or [b""]
        with self._send_lock:
            self._arm()
            for i, chunk in enumerate(chunks):
                last = i == len(chunks) - 1
                packet = (_LAST if last else _MORE) + chunk
                try:
                    if last and fds:
                        socket.send_fds(self.sock, [packet], list(fds))
                    else:
                        self.sock.sendall(packet)
                except TimeoutError:
                    raise self._timeout() from None
                except OSError as exc:
                    raise StagingError(f"the staging worker went away ({exc.strerror})") from None

    def recv(self) -> tuple[dict[str, Any], list[int]]:
        """The next message and the descriptors it carried (the caller closes them)."""
        parts: list[bytes] = []
        fds: list[int] = []
        size = 0
        while True:
            self._arm()
            try:
                packet, got, flags, _ = socket.recv_fds(self.sock, _PACKET + 1, MAX_FDS)
            except TimeoutError:
                close_fds(fds)
                raise self._timeout() from None
            except OSError as exc:
                close_fds(fds)
                raise StagingError(f"the staging worker went away ({exc.strerror})") from None
            fds.extend(got)
            if flags & socket.MSG_CTRUNC or not packet:
                close_fds(fds)
                raise EOFError("the other end closed the channel")
            size += len(packet)
            if size > _MAX_MESSAGE:
                close_fds(fds)
                raise StagingError("the staging worker sent an oversized message")
            parts.append(packet[1:])
            if packet[:1] == _LAST:
                break
        message = jsontext.loads(b"".join(parts), max_bytes=_MAX_MESSAGE)
        if not isinstance(message, dict) or not isinstance(message.get("t"), str):
            close_fds(fds)
            raise StagingError("the staging worker sent a malformed message")
        return message, fds

    def close(self) -> None:
        self.sock.close()

    def _arm(self) -> None:
        if self.deadline is None:
            self.sock.settimeout(None)
            return
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self._timeout()
        self.sock.settimeout(left)

    def _timeout(self) -> StagingError:
        return StagingError("staging ran out of its time budget")


def close_fds(fds: list[int]) -> None:
    """Close the descriptors a message brought (the receiver's to close)."""
    for fd in fds:
        os.close(fd)
