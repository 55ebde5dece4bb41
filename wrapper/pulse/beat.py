"""A node's beat to its job's hub, and its fence.

The node's watcher connects to the hub (trying the job's port sequence until the hub's
credential says root runs it for this job and attempt), beats every ``interval`` and
reads the hub's acks. Its lease is ``lost_after`` from the last ack: when it runs out on
an open connection (the hub's node frozen, or this node cut off), or when the hub says
``FENCED``, it calls ``on_fence`` once (the watcher kills the job's processes on this
node) and stops. A connection the hub ends (``END``, or its kernel closing it) ends the
lease without a fence: the hub's node is alive, the attempt is over or its watcher gone.

Until the hub answered once there is no lease, so no fence: a job whose hub never came up
(its ports taken, munged down) runs as it would without the pulse.

The beat thread touches no disk and logs nothing while it beats: a node stalled in a
page-cache flush still beats.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Callable

from wrapper.pulse import Settings, Signer
from wrapper.pulse.wire import LINE_MAX, SAMPLE_MAX, candidates, hello_payload, nonce, read_hello

CONNECT_WAIT = 1.0  # seconds for one connect
HUB_WAIT = 3.0  # seconds for the hub's answer to a hello (munged may be busy there; a
# squatter on a port of the sequence delays a join by this, no more, per port)


class Beater:
    def __init__(self, *, job_id: str, attempt: int, node: str, hub_host: str,
                 settings: Settings, on_fence: Callable[[float, str], None],
                 signer: Signer, uid: int = 0,
                 sample: Callable[[], bytes | None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.job_id, self.attempt, self.node, self.hub_host = job_id, attempt, node, hub_host
        self.sample = sample  # this node's newest sample of its ranks not yet sent, if any
        self.settings, self.on_fence, self.signer, self.uid = settings, on_fence, signer, uid
        self.clock = clock
        self.sock: socket.socket | None = None
        self.last_ack: float | None = None  # the lease runs from here; None: no lease
        self.done = False
        self.why = ""  # how it ended: "fenced", "end", "left", or "" while it runs
        self._buf = b""
        self._out = b""  # what the socket did not take yet
        self._seq = 0

    def run(self, stopped: Callable[[], bool]) -> None:
        try:
            while not stopped() and not self.done:
                if self.sock is None:
                    if not self._connect():
                        self._sleep_or_fence(self.settings.interval, stopped)
                    continue
                self._beat()
                self._listen(self.settings.interval)
        finally:
            self._close()

    def _sleep_or_fence(self, seconds: float, stopped: Callable[[], bool]) -> None:
        end = self.clock() + seconds
        while not stopped() and not self.done and self.clock() < end:
            self._check_lease()
            time.sleep(min(0.1, max(0.0, end - self.clock())))
        self._check_lease()

    def _check_lease(self) -> None:
        if self.last_ack is not None and not self.done:
            silent = self.clock() - self.last_ack
            if silent > self.settings.lost_after:
                self._fence(silent, "no ack from the hub")

    def _fence(self, silent: float, why: str) -> None:
        self.done, self.why = True, "fenced"
        if self.sock is not None:  # best effort: tell the hub, should it hear
            with contextlib.suppress(OSError):
                self.sock.send(b"FENCING\n")
        self.on_fence(silent, why)

    def _connect(self) -> bool:
        """Join the hub: the first port of the sequence whose hello is root's, for this job,
        attempt and port, in answer to this hello. Nothing a port says before that hello
        counts (a ``FENCED`` from a squatter is no one's word)."""
        from wrapper.pulse.munge import MungeError

        host = self.hub_host
        for port in candidates(self.job_id, self.attempt, self.settings.ports):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.settimeout(CONNECT_WAIT)
            mine = nonce()
            try:
                sock.connect((host, port))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                hello = self.signer.encode(hello_payload(
                    "beat", self.job_id, self.attempt, self.node, port=port, nonce=mine))
                sock.sendall(b"HELLO " + hello + b"\n")
                line, rest = _read_line(sock, self.clock() + HUB_WAIT, self.clock)
            except (OSError, MungeError):
                sock.close()
                continue
            if line is None or read_hello(line, self.signer, role="hub", job_id=self.job_id,
                                          attempt=self.attempt, uid=self.uid, port=port,
                                          echo=mine) is None:
                sock.close()
                continue
            sock.setblocking(False)
            self.sock, self.last_ack, self._buf = sock, self.clock(), rest
            return True
        return False

    def _beat(self) -> None:
        if self.sock is None:
            return
        self._seq += 1
        data = b"B %d\n" % self._seq
        if not self._out and self.sample is not None:  # a hub that reads: the sample too
            payload = self.sample()
            if payload is not None and len(payload) < SAMPLE_MAX:
                data += b"S " + payload + b"\n"
        self._out += data
        try:
            sent = self.sock.send(self._out)
            self._out = self._out[sent:]
        except (BlockingIOError, InterruptedError):
            pass  # the hub reads nothing: its silence is the lease's to judge
        except OSError:
            self._left()

    def _listen(self, seconds: float) -> None:
        end = self.clock() + seconds
        self._lines(b"")  # what came with the hub's hello (its FENCED)
        while self.sock is not None and not self.done:
            left = end - self.clock()
            self._check_lease()
            if left <= 0 or self.done:
                return
            try:
                ready, _, _ = select.select([self.sock], [], [], min(left, 0.1))
            except (OSError, ValueError):
                self._left()
                return
            self._check_lease()  # first: a thawed node's lease ran out while it was away
            if not ready or self.done:
                continue
            try:
                data = self.sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data:
                self._left()
                return
            self._lines(data)

    def _lines(self, data: bytes) -> None:
        """What the hub said, once it proved itself on this connection."""
        self._buf += data
        while b"\n" in self._buf and not self.done:
            line, self._buf = self._buf.split(b"\n", 1)
            if line.startswith(b"A "):
                self.last_ack = self.clock()
            elif line == b"FENCED":
                self._fence(0.0, "the hub judged this node lost")
            elif line == b"END":
                self.done, self.why = True, "end"
        if len(self._buf) > LINE_MAX:
            self._left()

    def _left(self) -> None:
        """The hub's side closed: no partition (its kernel answered), no lease."""
        self._close()
        self.last_ack = None
        self.done, self.why = True, "left"

    def _close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _read_line(sock: socket.socket, deadline: float,
               clock: Callable[[], float]) -> tuple[bytes | None, bytes]:
    """The first line and what came after it (the hub's ``FENCED`` may follow its hello)."""
    buf = b""
    while b"\n" not in buf:
        left = deadline - clock()
        if left <= 0 or len(buf) > LINE_MAX:
            return None, b""
        sock.settimeout(left)
        chunk = sock.recv(LINE_MAX)
        if not chunk:
            return None, b""
        buf += chunk
    line, rest = buf.split(b"\n", 1)
    return line, rest
