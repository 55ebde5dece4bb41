"""A throwaway sandbox cluster on free loopback ports, for the benchmarks that need Slurm."""

from __future__ import annotations

import contextlib
import socket
import tempfile
from collections.abc import Iterator

from jobwrap_dev.sandbox.cluster import Cluster, Spec


@contextlib.contextmanager
def sandbox(gpus_per_node: int = 4, nodes: int = 2) -> Iterator[Cluster]:
    """``nodes`` slurmd (n1, n2, ...) on this one host, each on its own loopback port."""
    ports = []
    socks = []
    for _ in range(nodes + 1):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        socks.append(sock)  # held until all are chosen: no port handed out twice
        ports.append(sock.getsockname()[1])
    for sock in socks:
        sock.close()
    base = tempfile.mkdtemp(prefix="jobwrap-bench-", dir="/tmp")
    cluster = Cluster(Spec(base=base, ctld_port=ports[0], node_ports=ports[1:],
                           nodes=[f"n{i}" for i in range(1, nodes + 1)],
                           gpus_per_node=gpus_per_node))
    cluster.up(log=lambda msg: None)
    try:
        yield cluster
    finally:
        cluster.down()
