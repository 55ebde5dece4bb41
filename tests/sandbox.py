"""The real local Slurm cluster (slurmctld + two slurmd), once per test session, shared by
the end-to-end and adversarial tiers (root, Debian). Registered as a plugin by
tests/conftest.py so both tiers get the same cluster."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from wrapper.sandbox.cluster import Cluster, Spec, _alive


def free_ports(count: int) -> list[int]:
    socks, ports = [], []
    for _ in range(count):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        socks.append(sock)
        ports.append(sock.getsockname()[1])
    for sock in socks:
        sock.close()
    return ports


def make_spec(prefix: str) -> Spec:
    if os.geteuid() != 0:
        pytest.fail("the end-to-end tests run a real Slurm and need root (CI runs as root); "
                    "run `sudo bash tools/test`", pytrace=False)
    base = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    ctld, *nodes = free_ports(1 + len(Spec().nodes))
    return Spec(base=base, ctld_port=ctld, node_ports=nodes)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    cluster = Cluster(make_spec("jobwrap-e2e-"))
    cluster.up(log=lambda msg: None)
    yield cluster
    daemons = list(cluster.daemons)
    cluster.down()
    left = [d.name for d in daemons if _alive(d)]
    assert not left, f"the harness left daemons running: {left}"
    strays = [p.pid for p in cluster.runtime_processes() + cluster.stepds()]
    assert not strays, f"jobwrap or Slurm processes of the test cluster outlived it: {strays}"


@pytest.fixture
def job_state(cluster: Cluster) -> Path:
    return cluster.state_dir / "jobs"
