"""A throwaway sandbox cluster on free loopback ports, for the benchmarks that need Slurm."""

from __future__ import annotations

import contextlib
import socket
import tempfile
from collections.abc import Iterator

from wrapper.sandbox.cluster import Cluster, Spec


@contextlib.contextmanager
def sandbox(gpus_per_node: int = 4) -> Iterator[Cluster]:
    ports = []
    for _ in range(3):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    base = tempfile.mkdtemp(prefix="jobwrap-bench-", dir="/tmp")
    cluster = Cluster(Spec(base=base, ctld_port=ports[0], node_ports=ports[1:],
                           gpus_per_node=gpus_per_node))
    cluster.up(log=lambda msg: None)
    try:
        yield cluster
    finally:
        cluster.down()
