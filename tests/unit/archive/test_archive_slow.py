"""The site's choice for slow nodes (wrapper/archive/slow.py): with ``[pulse]
slow_drain_users = N`` the indexer drains a node that N different users' jobs named slow
within the window; one user's jobs, however many, never do; a node already out of service
is left alone; and the health check never resumes a slow drain."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.archive import config_file, write_job
from wrapper.archive.index import SqliteIndex
from wrapper.archive.slow import drain_named, named
from wrapper.config import Config, load
from wrapper.errors import ConfigError
from wrapper.gpu.undrain import decide_resume
from wrapper.slurm.fake import FakeSlurm

DAY = 86400.0


def _cfg(shared: Path, users: int, days: float = 7.0) -> Config:
    path = config_file(shared)
    with open(path, "a") as handle:
        handle.write(f"[pulse]\nslow_drain_users = {users}\nslow_drain_days = {days}\n")
    return load(path)


def _index(root: Path) -> SqliteIndex:
    index = SqliteIndex(str(root))
    index.rebuild()
    return index


def test_nodes_named_slow_are_counted_by_user(root: Path) -> None:
    write_job(root, "ann", "1", nodes=("n1", "n3"), slow={"n3": 0.7}, kinds=("hang",
                                                                             "success"))
    write_job(root, "ann", "2", nodes=("n1", "n3"), slow={"n3": 0.6})
    write_job(root, "ben", "3", nodes=("n2", "n3"), slow={"n3": 0.8, "n2": 0.5})
    found = named(_index(root), since=0.0)
    assert found["n3"].users == {"ann", "ben"} and found["n3"].attempts == 4
    assert found["n3"].lowest == 0.6 and found["n2"].users == {"ben"}


def test_two_users_jobs_drain_a_node_one_users_never(shared: Path, root: Path) -> None:
    for n in range(4):  # one user, four jobs: the score is their own processes' state
        write_job(root, "ann", str(n + 1), nodes=("n1", "n2"), slow={"n2": 0.5})
    write_job(root, "ann", "10", nodes=("n3",), slow={"n3": 0.7})
    write_job(root, "ben", "11", nodes=("n3",), slow={"n3": 0.61})
    slurm = FakeSlurm(nodes={n: {"State": "IDLE"} for n in ("n1", "n2", "n3")})
    said: list[str] = []
    cfg, index = _cfg(shared, 2), _index(root)
    assert drain_named(cfg, index, slurm, 1e12, said.append) == []  # past the 7-day window
    assert slurm.calls == []
    drained = drain_named(cfg, index, slurm, time.time(), said.append)
    assert drained == ["n3"]
    [(_, node, reason)] = [c for c in slurm.calls if c[0] == "drain_node"]
    assert node == "n3"
    assert reason == ("jobwrap: slow: named by 2 users' jobs in 7 d (2 attempts, speed down "
                      "to 0.61); resume by hand once fixed")
    assert said == [f"drained n3: {reason}"]
    assert decide_resume("IDLE+DRAIN", reason, "pass").resume is False
    assert "only an admin resumes it" in decide_resume("IDLE+DRAIN", reason, "pass").why
    assert decide_resume("IDLE+DRAIN", "jobwrap: gpu 0: Xid 79", "pass").resume is True


def test_off_by_default_and_a_node_out_of_service_is_left(shared: Path, root: Path) -> None:
    write_job(root, "ann", "1", nodes=("n3",), slow={"n3": 0.7})
    write_job(root, "ben", "2", nodes=("n3",), slow={"n3": 0.7})
    slurm = FakeSlurm(nodes={"n3": {"State": "IDLE"}})
    assert drain_named(load(config_file(shared)), _index(root), slurm, time.time(),
                       print) == [] and slurm.calls == []
    slurm = FakeSlurm(nodes={"n3": {"State": "MIXED+DRAIN"}})
    assert drain_named(_cfg(shared, 2), _index(root), slurm, time.time(), print) == []
    assert [c for c in slurm.calls if c[0] == "drain_node"] == []


def test_a_config_letting_one_user_drain_is_refused(shared: Path) -> None:
    with pytest.raises(ConfigError, match="slow_drain_users = 1: one user's jobs would drain"):
        _cfg(shared, 1)


def test_a_node_an_admin_resumed_needs_new_evidence(shared: Path, root: Path) -> None:
    from tests.support.archive import NOW

    for n, user in enumerate(("ann", "ben")):
        write_job(root, user, str(n + 1), age_s=3 * DAY, nodes=("n3",), slow={"n3": 0.7})
    slurm = FakeSlurm(nodes={"n3": {"State": "IDLE"}})
    cfg = _cfg(shared, 2)
    assert drain_named(cfg, _index(root), slurm, NOW - 2 * DAY, print) == ["n3"]
    slurm.nodes["n3"]["State"] = "IDLE"  # an admin looked, and resumed it
    assert drain_named(cfg, _index(root), slurm, time.time(), print) == []  # the old evidence
    write_job(root, "carl", "3", nodes=("n3",), slow={"n3": 0.6})
    assert drain_named(cfg, _index(root), slurm, time.time(), print) == []  # one user's new
    write_job(root, "dan", "4", nodes=("n3",), slow={"n3": 0.6})
    assert drain_named(cfg, _index(root), slurm, time.time(), print) == ["n3"]
