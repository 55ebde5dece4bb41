"""The pulse between real processes through the node's real munged: a hub in this test's
process, each node's beater a process of its own, frozen and thawed with signals as a node
would be. Short clocks here (lost after 0.8 s); tests/bench/node-loss runs the defaults."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from wrapper.pulse import Settings, munge
from wrapper.pulse.hub import Hub
from wrapper.pulse.wire import candidates, hello_payload, port_range

UID = os.geteuid()
FAST = Settings(interval=0.1, lost_after=0.8, fence_grace=0.3, ports=(0, 0))  # (0, 0): any free

BEATER = """
import sys, threading, time, os
from wrapper.pulse import Settings, munge
from wrapper.pulse.beat import Beater
job, node, lo, hi, lost, stall = sys.argv[1], sys.argv[2], *map(float, sys.argv[3:7]),
settings = Settings(interval=0.1 if lost < 2 else 0.5, lost_after=lost, ports=(int(lo), int(hi)))
def fence(silent, why):
    print(f"FENCED {silent:.2f} {why}", flush=True)
b = Beater(job_id=job, attempt=0, node=node, hub_host="127.0.0.1", settings=settings,
           on_fence=fence, signer=munge, uid=os.geteuid())
t = threading.Thread(target=b.run, args=(lambda: False,), daemon=True)
t.start()
if stall:  # the main thread stalls in a write that does not return (a page-cache flush)
    r, w = os.pipe()
    print("STALLING", flush=True)
    def drain():
        got = 0
        while got < 1 << 20:
            got += len(os.read(r, 1 << 16))
    threading.Timer(stall, drain).start()
    os.write(w, b"x" * (1 << 20))
    print("STALL OVER", flush=True)
t.join()
print(f"DONE {b.why}", flush=True)
"""


def _free_ports() -> tuple[int, int]:
    """A free port now, as a range of one (the hub's sequence is that port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return port, port


class Run:
    def __init__(self, tmp: Path, nodes: list[str], settings: Settings) -> None:
        self.tmp, self.settings = tmp, settings
        self.lost: list[tuple[str, float, float]] = []
        self.hub = Hub(job_id="77", attempt=0, node="n1", nodes=["n1", *nodes],
                       settings=settings, signer=munge, uid=UID,
                       on_lost=lambda node, silent: self.lost.append(
                           (node, silent, time.monotonic())))
        assert self.hub.bind("127.0.0.1") is not None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.hub.run, args=(self.stop.is_set,))
        self.thread.start()
        self.procs: dict[str, subprocess.Popen[str]] = {}

    def beater(self, node: str, stall: float = 0.0) -> subprocess.Popen[str]:
        lo, hi = self.settings.ports
        proc = subprocess.Popen(
            [sys.executable, "-c", BEATER, "77", node, str(lo), str(hi),
             str(self.settings.lost_after), str(stall)],
            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[3])
        self.procs[node] = proc
        return proc

    def joined(self, *nodes: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(n in self.hub.seen for n in nodes):
                return
            time.sleep(0.05)
        raise AssertionError(f"{nodes} never joined; seen {self.hub.seen}")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait()


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    made: list[Run] = []

    def make(nodes: list[str], settings: Settings = FAST) -> Run:
        ports = settings.ports if settings.ports != (0, 0) else _free_ports()
        made.append(Run(tmp_path, nodes, Settings(
            interval=settings.interval, lost_after=settings.lost_after,
            fence_grace=settings.fence_grace, ports=ports)))
        return made[-1]

    yield make
    for r in made:
        r.close()


def _lines(proc: subprocess.Popen[str], timeout: float = 10.0) -> list[str]:
    """What a beater printed until it ended (it ends after a fence, an END or a leave)."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out.splitlines()


def test_a_frozen_node_is_lost_within_lost_after_and_fences_itself_when_it_thaws(
        run: Callable[..., Run]) -> None:
    r = run(["n2", "n3"])
    n2 = r.beater("n2")
    r.beater("n3")
    r.joined("n2", "n3")
    frozen = time.monotonic()
    n2.send_signal(signal.SIGSTOP)  # the whole node stops: its kernel says nothing
    deadline = frozen + 5
    while not r.lost and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [x[0] for x in r.lost] == ["n2"]
    assert FAST.lost_after - FAST.interval < r.lost[0][2] - frozen < FAST.lost_after + 0.5
    time.sleep(1.0)
    assert [x[0] for x in r.lost] == ["n2"], "n3 beat on: it is not lost"
    n2.send_signal(signal.SIGCONT)  # it comes back: its lease ran out while it was away
    out = _lines(n2)
    assert out[0].startswith("FENCED") and out[-1] == "DONE fenced", out


def test_a_node_whose_watcher_ends_is_a_departure_not_a_loss(run: Callable[..., Run]) -> None:
    r = run(["n2"])
    n2 = r.beater("n2")
    r.joined("n2")
    n2.kill()  # its kernel closes the connection: the node is alive
    n2.wait()
    time.sleep(3 * FAST.lost_after)
    assert r.lost == [] and "n2" not in r.hub.seen


def test_a_held_up_hub_blames_no_node_and_the_nodes_fence_themselves(
        run: Callable[..., Run]) -> None:
    r = run(["n2", "n3"])
    beaters = [r.beater("n2"), r.beater("n3")]
    r.joined("n2", "n3")
    held = threading.Event()
    release = threading.Event()
    real_select = r.hub.sel.select

    def select(timeout: float | None = None) -> list:  # type: ignore[type-arg]
        if not held.is_set():
            held.set()
            release.wait()  # the hub's node stalls: nothing of it runs
        return real_select(timeout)

    r.hub.sel.select = select  # type: ignore[method-assign]
    held.wait(5)
    time.sleep(3 * FAST.lost_after)
    release.set()
    for proc in beaters:  # no ack for lost_after: each fenced the job's work on its node
        out = _lines(proc)
        assert out[0].startswith("FENCED") and "no ack" in out[0], out
    time.sleep(2 * FAST.lost_after)
    assert r.lost == [], "the hub's own stall is nobody's loss"


def test_the_hubs_end_fences_nothing(run: Callable[..., Run]) -> None:
    r = run(["n2"])
    n2 = r.beater("n2")
    r.joined("n2")
    r.stop.set()
    r.thread.join(5)
    assert _lines(n2) == ["DONE end"]


def test_a_main_thread_stalled_30_s_in_a_write_still_beats(run: Callable[..., Run]) -> None:
    """The defaults (a beat each 0.5 s, lost after 4.5 s): the watcher's main thread stuck
    in a write for 30 s (as in a page-cache flush) does not hold up the beat thread."""
    r = run(["n2"], Settings())
    n2 = r.beater("n2", stall=30.0)
    r.joined("n2")
    assert n2.stdout is not None and n2.stdout.readline().strip() == "STALLING"
    assert n2.stdout.readline().strip() == "STALL OVER"
    assert r.lost == [] and "n2" in r.hub.seen


def test_strangers_neither_join_nor_drown_the_beats(run: Callable[..., Run]) -> None:
    """A user's own credential for this job, garbage, and a flood of idle connections:
    none is taken for a node, and the real node beats on through them."""
    from tests.support import USER

    r = run(["n2"])
    r.beater("n2")
    r.joined("n2")
    payload = hello_payload("beat", "77", 0, "n3", port=r.hub.port, nonce="x").decode()
    users = subprocess.run(["runuser", "-u", USER, "--", "munge", "-s", payload],
                           capture_output=True, check=True, timeout=10).stdout.strip()
    port = r.hub.port
    strangers = []
    for i in range(60):
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        s.sendall([b"HELLO " + users + b"\n", b"HELLO MUNGE:nonsense:\n", b"B 1\n",
                   b"x" * 5000][i % 4])
        strangers.append(s)
    time.sleep(3 * FAST.lost_after)
    assert set(r.hub.by_node) == {"n2"} and r.lost == []
    assert len(r.hub.pending) <= 16
    for s in strangers:
        s.close()


def test_a_hub_of_another_job_on_the_sequence_is_passed_over(run: Callable[..., Run]) -> None:
    """A port of the job's sequence held by root's hub of another job (or anything else):
    the beater tries the next one, where the job's own hub listens."""
    lo = 20000 + os.getpid() % 20000
    ports = (lo, lo + 50)
    first = candidates("77", 0, ports)[0]
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    other.bind(("127.0.0.1", first))
    other.listen(4)

    def wrong_hub() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = other.accept()
                conn.recv(4096)
                conn.sendall(b"HELLO " + munge.encode(hello_payload(
                    "hub", "78", 0, "n9", port=first, nonce="x")) + b"\n")

    threading.Thread(target=wrong_hub, daemon=True).start()
    try:
        r = run(["n2"], Settings(interval=0.1, lost_after=0.8, ports=ports))
        assert r.hub.port != first
        r.beater("n2")
        r.joined("n2")
    finally:
        other.close()


def test_port_ranges_read_or_say_what_is_wrong() -> None:
    assert port_range("7400-7599") == (7400, 7599)
    for bad in ("7400", "a-b", "7600-7400", "0-10", "1-70000"):
        with pytest.raises(ValueError, match="port"):
            port_range(bad)
    seq = candidates("12", 3, (7400, 7403))
    assert sorted(seq) == [7400, 7401, 7402, 7403] and seq == candidates("12", 3, (7400, 7403))


def _squat(port: int, serve: Callable[[socket.socket], None]) -> socket.socket:
    """A listener on ``port`` (as anyone could hold one of the job's sequence) whose
    every connection ``serve`` answers, in a thread."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(8)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = sock.accept()
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return sock


def _close(sock: socket.socket) -> None:
    """Close a listener whose thread waits in accept() (shutdown wakes it first)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _sequence(offset: int) -> tuple[tuple[int, int], int]:
    """A port range of this test's own and the first port of job 77's sequence in it."""
    lo = 20000 + (os.getpid() * 7 + 60 * offset) % 20000
    ports = (lo, lo + 50)
    return ports, candidates("77", 0, ports)[0]


def test_a_squatter_saying_fenced_first_fences_nothing(run: Callable[..., Run]) -> None:
    """Nothing a port says before root's hello counts: a squatter's FENCED kills no job."""
    ports, first = _sequence(1)

    def fenced(conn: socket.socket) -> None:
        with conn:
            conn.sendall(b"FENCED\n")
            time.sleep(1)

    squatter = _squat(first, fenced)
    try:
        r = run(["n2"], Settings(interval=0.1, lost_after=0.8, ports=ports))
        assert r.hub.port != first
        n2 = r.beater("n2")
        r.joined("n2")
        time.sleep(3 * FAST.lost_after)
        assert n2.poll() is None and r.lost == [], "n2 beats on, unfenced"
    finally:
        _close(squatter)


def test_a_relay_between_a_node_and_its_hub_is_refused(run: Callable[..., Run]) -> None:
    """Whoever holds the sequence's first port passes a node's hello on to the real hub
    and the hub's answer back, then goes silent: the node's hello names the port it
    dialled, so the hub refuses it; the node then joins the hub itself, and nothing is
    lost or fenced."""
    ports, first = _sequence(2)
    relayed: list[bytes] = []

    def relay(conn: socket.socket) -> None:
        with conn, socket.create_connection(("127.0.0.1", r.hub.port), timeout=5) as hub:
            line = conn.recv(4096)
            relayed.append(line)
            hub.sendall(line)
            with contextlib.suppress(OSError):
                answer = hub.recv(4096)
                if answer:
                    conn.sendall(answer)
            time.sleep(10)  # silent both ways

    squatter = _squat(first, relay)
    try:
        r = run(["n2"], Settings(interval=0.1, lost_after=0.8, ports=ports))
        n2 = r.beater("n2")
        r.joined("n2", timeout=20)  # after the relay's silence (HUB_WAIT)
        time.sleep(3 * FAST.lost_after)
        assert relayed and relayed[0].startswith(b"HELLO MUNGE:")  # the relay was tried
        assert n2.poll() is None and r.lost == [] and list(r.hub.by_node) == ["n2"]
    finally:
        _close(squatter)


class _SlowAfterJoin:
    """munged kept busy by another user (its two threads held): every decode after the
    first join takes ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        self.delay, self.slow = delay, False

    def encode(self, payload: bytes) -> bytes:
        return munge.encode(payload)

    def decode(self, cred: bytes) -> munge.Credential:
        if self.slow:
            time.sleep(self.delay)
        return munge.decode(cred)


def test_a_busy_munged_delays_a_join_never_an_ack(run: Callable[..., Run]) -> None:
    r = run(["n2", "n3"])
    signer = _SlowAfterJoin(2.5 * FAST.lost_after)  # past a lease, inside HUB_WAIT
    r.hub.signer = signer
    n2 = r.beater("n2")
    r.joined("n2")
    signer.slow = True
    n3 = r.beater("n3")  # its hello waits on munged; n2's beats are acked meanwhile
    with socket.create_connection(("127.0.0.1", r.hub.port)) as stranger:
        stranger.sendall(b"HELLO MUNGE:stuck:\n")
        time.sleep(3 * FAST.lost_after)
        assert n2.poll() is None and r.lost == [] and "n2" in r.hub.seen
    r.joined("n3", timeout=20)
    assert n3.poll() is None


class _Refusing:
    """munged down at the hub: every encode fails."""

    def __init__(self) -> None:
        self.down = True

    def encode(self, payload: bytes) -> bytes:
        if self.down:
            raise munge.MungeError("munge encode: Socket communication error")
        return munge.encode(payload)

    def decode(self, cred: bytes) -> munge.Credential:
        return munge.decode(cred)


def test_munged_down_at_the_hub_refuses_joins_and_the_hub_lives_on(
        run: Callable[..., Run]) -> None:
    r = run(["n2"])
    signer = _Refusing()
    r.hub.signer = signer
    n2 = r.beater("n2")
    time.sleep(2)
    assert r.thread.is_alive() and r.hub.by_node == {} and n2.poll() is None
    signer.down = False  # munged is back: the node joins on its next try
    r.joined("n2", timeout=10)
