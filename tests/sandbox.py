"""The real local Slurm cluster (slurmctld + two slurmd), once per test session, shared by
the end-to-end and adversarial tiers (root, Debian). Registered as a plugin by
tests/conftest.py so both tiers get the same cluster."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator

import pytest

from jobwrap_dev.sandbox.cluster import Cluster, Spec
from jobwrap_dev.sandbox.daemons import alive

# Each pytest process (one tier, or one xdist worker of it) takes ports from a block of
# its own: JOBWRAP_TEST_PORT_BASE (tools/test gives each tier its own, below the kernel's
# ephemeral range) plus PORT_BLOCK per worker. No two sandboxes side by side ever race
# for a port that one of them bound and closed; a port taken by anything else is skipped.
PORT_BLOCK = 200
PULSE_PORTS = 64  # the top of each block: the hubs of its sandbox's jobs ([pulse] ports)
_taken: list[int] = []


def _whole_block() -> range:
    base = int(os.environ.get("JOBWRAP_TEST_PORT_BASE", "20000"))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    start = base + PORT_BLOCK * (int(worker) if worker.isdigit() else 0)
    return range(start, start + PORT_BLOCK)


def _block() -> range:
    return _whole_block()[:-PULSE_PORTS]


def pulse_ports() -> str:
    top = _whole_block()[-PULSE_PORTS:]
    return f"{top[0]}-{top[-1]}"


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """``count`` loopback ports of this process's block, never handed out twice."""
    ports = []
    for port in _block():
        if len(ports) == count:
            break
        if port not in _taken and _bindable(port):
            ports.append(port)
    if len(ports) < count:
        pytest.fail(f"no {count} free loopback ports left in {_block()} (this test process's "
                    "block; set JOBWRAP_TEST_PORT_BASE to move it)", pytrace=False)
    _taken.extend(ports)
    return ports


def make_spec(prefix: str) -> Spec:
    if os.geteuid() != 0:
        pytest.fail("the end-to-end tests run a real Slurm and need root (CI runs as root); "
                    "run `sudo bash tools/test`", pytrace=False)
    base = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    ctld, *nodes = free_ports(1 + len(Spec().nodes))
    return Spec(base=base, ctld_port=ctld, node_ports=nodes, pulse_ports=pulse_ports())


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    cluster = Cluster(make_spec("jobwrap-e2e-"))
    cluster.up(log=lambda msg: None)
    yield cluster
    daemons = list(cluster.daemons)
    cluster.down()
    left = [d.name for d in daemons if alive(d)]
    assert not left, f"the harness left daemons running: {left}"
    strays = [p.pid for p in cluster.runtime_processes() + cluster.stepds()]
    assert not strays, f"jobwrap or Slurm processes of the test cluster outlived it: {strays}"

