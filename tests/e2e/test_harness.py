"""The harness itself: a second cluster comes up beside the first and leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import psutil

from jobwrap_dev.sandbox.cluster import Cluster
from jobwrap_dev.sandbox.daemons import alive
from tests.sandbox import make_spec


def _processes_using(conf: Path) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if str(conf) in cmdline:
            found.append(proc.pid)
    return found


def test_up_then_down_leaves_no_daemon(cluster: Cluster) -> None:
    other = Cluster(make_spec("jobwrap-harness-"))
    try:
        other.up(log=lambda msg: None)
        names = sorted(d.name for d in other.daemons)
        assert other.spec.nodes == ["n1", "n2", "n3"]
        assert names == ["slurmctld", "slurmd-n1", "slurmd-n2", "slurmd-n3"]  # munge: shared
        assert all(alive(d) for d in other.daemons)
        assert set(other.node_states().values()) == {"idle"}
        assert len(_processes_using(other.conf)) == 4
    finally:
        daemons = list(other.daemons)
        stopped = other.down()
    assert sorted(stopped) == names
    assert not any(alive(d) for d in daemons)
    assert _processes_using(other.conf) == []
    assert other.runtime_processes() == []
    # the session's cluster was not touched
    assert all(alive(d) for d in cluster.daemons)
