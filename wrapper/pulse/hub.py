"""The hub: the job's first node's watcher hears every other node's watcher beat.

A node is *lost* when its connection stays open but silent for ``lost_after`` seconds:
frozen, powered off or cut off, its kernel sends nothing, not even the end of the
connection. A connection that ends (the other watcher stopped or died, its node's kernel
alive) is a departure, never a loss. The hub judges only nodes it heard once, and forgives
its own stalls: when its loop itself was held up (a frozen watcher, a starved CPU), the
time it lost is added to every node's silence budget instead of charged to the nodes.

Nothing slow runs in the loop that reads beats and sends acks: each hello's credential
is checked by munged (which another user can keep busy), every node's sample of its
ranks is handed on (parsed there) and every log line is written (to a disk that can
stall) by a worker thread of the hub's own; a slow munged only delays a join, never an
ack.

On a loss it tells the node ``FENCED`` should it ever speak again and calls ``on_lost``
once (in a thread of its own: the watcher records root's ``pulse.lost``, waits out the
node's lease and sets it DOWN in Slurm, see wrapper/watch/process.py).
"""

from __future__ import annotations

import contextlib
import contextvars
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from wrapper import log
from wrapper.pulse import Settings, Signer
from wrapper.pulse.wire import LINE_MAX, SAMPLE_MAX, candidates, hello_payload, nonce, read_hello

TICK = 0.25  # seconds between two judgements
HELLO_WAIT = 2.0  # seconds a new connection has to say who it is
PENDING_MAX = 16  # connections that have not said who they are, at most (oldest dropped)


VERIFY_WAIT = 30.0  # seconds a hello may wait for munged's verdict (a busy munged)


class _Conn:
    __slots__ = ("buf", "deadline", "node", "sock", "verifying")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline, self.node, self.buf = sock, deadline, "", b""
        self.verifying = False


class Hub:
    def __init__(self, *, job_id: str, attempt: int, node: str, nodes: Collection[str],
                 settings: Settings, on_lost: Callable[[str, float], None],
                 signer: Signer, uid: int = 0,
                 on_sample: Callable[[str, bytes], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.job_id, self.attempt, self.node = job_id, attempt, node
        self.on_sample = on_sample  # a joined node's sample of its ranks (root's, on its node)
        self.nodes = frozenset(nodes) - {node}
        self.settings, self.on_lost, self.signer, self.uid = settings, on_lost, signer, uid
        self.clock = clock
        self.seen: dict[str, float] = {}  # node -> when it was last heard (clock)
        self.lost: set[str] = set()
        self.by_node: dict[str, _Conn] = {}
        self.pending: list[_Conn] = []
        self.sel = selectors.DefaultSelector()
        self.listener: socket.socket | None = None
        self.port = 0
        self._last_tick = clock()
        # the worker's work (hellos to check, log lines) and its verdicts on hellos
        self._work: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self._verdicts: queue.SimpleQueue[tuple[_Conn, str | None, bytes]] = \
            queue.SimpleQueue()
        self._worker: threading.Thread | None = None

    def bind(self, host: str) -> int | None:
        """Listen on the first free port of the job's sequence; None when all are taken."""
        for port in candidates(self.job_id, self.attempt, self.settings.ports):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
                sock.listen(128)
            except OSError:
                sock.close()
                continue
            sock.setblocking(False)
            self.listener, self.port = sock, port
            self.sel.register(sock, selectors.EVENT_READ, None)
            return port
        return None

    def run(self, stopped: Callable[[], bool]) -> None:
        self._worker = threading.Thread(target=contextvars.copy_context().run,
                                        args=(self._work_loop,), daemon=True,
                                        name="pulse-hub-worker")
        self._worker.start()
        try:
            while not stopped():
                self.step(TICK)
        finally:
            self.close()
            self._work.put(None)

    def step(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            if key.data is None:
                self._accept()
            else:
                self._read(key.data)
        self._take_verdicts()
        self.judge()

    def note(self, level: str, event: str, **fields: Any) -> None:
        """A log line, written by the worker: the loop never waits on a disk."""
        self._work.put(("log", (level, event, fields)))

    def _work_loop(self) -> None:
        while (item := self._work.get()) is not None:
            what, value = item
            try:
                if what == "log":
                    level, event, fields = value
                    getattr(log.get(), level)(event, **fields)
                elif what == "sample":
                    if self.on_sample is not None:
                        self.on_sample(*value)
                else:
                    conn, line = value
                    self._verdicts.put((conn, *self._verify(line)))
            except Exception as exc:  # the worker outlives any one item
                if what == "hello":
                    self._verdicts.put((value[0], None, b""))
                with contextlib.suppress(Exception):
                    log.get().error("pulse.worker_error", error=str(exc)[:300])

    def _verify(self, line: bytes) -> tuple[str | None, bytes]:
        """(node, the hub's hello to it) for a root hello of one of the job's nodes on
        this port; (None, b"") for anything else."""
        from wrapper.pulse.munge import MungeError

        said = read_hello(line, self.signer, role="beat", job_id=self.job_id,
                          attempt=self.attempt, uid=self.uid, port=self.port)
        if said is None or said["node"] not in self.nodes:
            return None, b""
        try:
            reply = self.signer.encode(hello_payload(
                "hub", self.job_id, self.attempt, self.node, port=self.port, nonce=nonce(),
                echo=said["nonce"]))
        except MungeError as exc:
            log.get().error("pulse.munge_failed", error=str(exc)[:300])
            return None, b""
        return said["node"], b"HELLO " + reply + b"\n"

    def _take_verdicts(self) -> None:
        while True:
            try:
                conn, node, reply = self._verdicts.get_nowait()
            except queue.Empty:
                return
            if conn not in self.pending:
                continue  # dropped meanwhile (its time ran out, or the hub closes)
            self.pending.remove(conn)
            conn.verifying = False
            if node is None:
                self._drop(conn)
                continue
            self._send(conn, reply)
            if node in self.lost:  # judged lost: it must have fenced itself; say so
                self._send(conn, b"FENCED\n")
                self._drop(conn)
                continue
            old = self.by_node.get(node)
            if old is not None:
                self._drop(old)
            conn.node = node
            self.by_node[node] = conn
            self.seen[node] = self.clock()
            self.note("info", "pulse.joined", joined_node=node)

    def judge(self) -> None:
        now = self.clock()
        stalled = now - self._last_tick - TICK
        self._last_tick = now
        if stalled > self.settings.interval:  # the hub was held up, not the nodes
            for node in self.seen:
                self.seen[node] += stalled
        for conn in [c for c in self.pending if now > c.deadline]:
            self._drop(conn)
        for node, heard in list(self.seen.items()):
            silent = now - heard
            if node not in self.lost and silent > self.settings.lost_after:
                self.lost.add(node)
                held = self.by_node.get(node)
                if held is not None:  # should it ever read again
                    self._send(held, b"FENCED\n")
                    self._drop(held)
                self.seen.pop(node, None)
                self.note("error", "pulse.lost", lost_node=node, silent_s=round(silent, 2))
                threading.Thread(target=contextvars.copy_context().run,  # the log's context
                                 args=(self.on_lost, node, silent), daemon=True,
                                 name=f"pulse-lost-{node}").start()

    def close(self) -> None:
        """Stop: every node hears ``END`` (the attempt is over, fence nothing)."""
        for conn in list(self.by_node.values()):
            self._send(conn, b"END\n")
            self._drop(conn)
        for conn in list(self.pending):
            self._drop(conn)
        if self.listener is not None:
            self.sel.unregister(self.listener)
            self.listener.close()
            self.listener = None
        self.sel.close()

    def _accept(self) -> None:
        if self.listener is None:
            return
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(sock, self.clock() + HELLO_WAIT)
        if len(self.pending) >= PENDING_MAX:  # a flood of strangers: the oldest goes
            self._drop(self.pending[0])
        self.pending.append(conn)
        self.sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the other side ended it: its kernel is alive, a departure
            if conn.node:
                self.note("info", "pulse.left", left_node=conn.node)
            self._drop(conn)
            return
        if conn.verifying:  # nothing is said before the hub's answer
            self._drop(conn)
            return
        conn.buf += data
        while b"\n" in conn.buf and not conn.verifying:
            line, conn.buf = conn.buf.split(b"\n", 1)
            if not self._line(conn, line):
                self._drop(conn)
                return
        if len(conn.buf) > (SAMPLE_MAX if conn.node else LINE_MAX):
            self._drop(conn)

    def _line(self, conn: _Conn, line: bytes) -> bool:
        if not conn.node:  # its hello: munged's verdict comes back through the worker
            if not line.startswith(b"HELLO MUNGE:") or len(line) > LINE_MAX or conn.buf:
                return False
            conn.verifying = True
            conn.deadline = self.clock() + VERIFY_WAIT
            self._work.put(("hello", (conn, line)))
            return True
        if line.startswith(b"B "):
            self.seen[conn.node] = self.clock()
            self._send(conn, b"A " + line[2:22] + b"\n")
            return True
        if line.startswith(b"S ") and len(line) <= SAMPLE_MAX:
            if self.on_sample is not None:  # parsed by the worker: never delays an ack
                self._work.put(("sample", (conn.node, line[2:])))
            return True
        if line == b"FENCING":  # it lost the hub (this one was held up): a departure
            self.note("warning", "pulse.fenced_itself", fenced_node=conn.node)
        return False  # nothing else is said after the hello

    def _send(self, conn: _Conn, data: bytes) -> None:
        # a full buffer (a frozen reader) or a gone peer: the silence judges it
        with contextlib.suppress(OSError):
            conn.sock.send(data)

    def _drop(self, conn: _Conn) -> None:
        """Close ``conn``; a node whose connection it was is no longer judged."""
        if conn in self.pending:
            self.pending.remove(conn)
        if conn.node and self.by_node.get(conn.node) is conn:
            del self.by_node[conn.node]
            self.seen.pop(conn.node, None)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn.sock)
        conn.sock.close()
