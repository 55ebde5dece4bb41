"""The archive's index on a real MariaDB (``[archive] index_backend = "mariadb"``), a
private one on loopback started for this module: it tells what the manifests tell, as
SQLite's does; two clusters share one database and never see each other's rows; the
upsert never replaces a newer row; a newer layout is left alone and an older one made
again; a database that is down, a connection file others can read and a missing driver
each cost one line and the manifests are read; an ordinary user's command never
connects."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from jobwrap_dev.sandbox.database import PrivateMariaDb, throwaway
from tests.support.archive import NOW, config_file, write_job
from wrapper.archive import index as index_mod
from wrapper.archive import store
from wrapper.archive.index_mariadb import MariaDbIndex, cluster_name
from wrapper.archive.spool import SCHEMA
from wrapper.cli import cli
from wrapper.config import load
from wrapper.errors import FormatTooNew
from wrapper.goodput import report
from wrapper.osl.child import call_as
from wrapper.osl.users import UserIds

DATABASE = "jobwrap_index"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def database() -> Iterator[PrivateMariaDb]:
    with throwaway("jobwrap-index-mariadb-") as db:
        yield db


@pytest.fixture
def connection(database: PrivateMariaDb, tmp_path: Path) -> Path:
    """A fresh database and the root-only option file naming it."""
    return database.new_database(f"{DATABASE}_{os.urandom(3).hex()}", tmp_path / "index.cnf")


def _index(root: Path, connection: Path, cluster: str = "alpha") -> MariaDbIndex:
    return MariaDbIndex(str(root), str(connection), cluster)


def test_the_mariadb_index_tells_what_the_manifests_tell(root: Path, connection: Path
                                                         ) -> None:
    for n in range(12):
        kinds = (("hardware", "success"), ("hang", "node_failure", "success"),
                 ("success",))[n % 3]
        write_job(root, f"u{n % 2}", str(n + 1), age_s=(n + 1) * 3600, kinds=kinds,
                  nodes=(f"n{n % 4}", f"n{n % 5}"))
    index = _index(root, connection)
    with pytest.raises(index_mod.IndexFault, match="there is no index"):
        index.check()
    built = index.rebuild()
    assert (built.jobs, built.skipped) == (12, [])
    index.check()
    since = NOW - 8 * 3600
    scanned, _ = report.from_archive(str(root), since=since, now=NOW)
    indexed, _ = report.from_index(index, since=since)
    assert report.build(indexed, since=since).as_dict() == report.build(
        scanned, since=since).as_dict()
    assert index.mtbf(since) == pytest.approx(report.build(scanned, since=since).mtbf_s)
    assert [i.as_dict() for i in index.jobs(since=since, user="u1")] == [
        i.as_dict() for i in store.list_archives(str(root), "u1", since)]
    assert index.locate("3") == ["u0"] and index.total_size() == sum(
        i.size for i in store.list_archives(str(root), None, None))
    write_job(root, "u0", "13")  # the epilog's spool, folded by the next reader
    assert index.fold() == 1 and [i.job_id for i in index.jobs(user="u0")][-1] == "13"
    index.forget([i for i in index.jobs() if i.job_id == "13"])
    assert "13" not in [i.job_id for i in index.jobs()]
    index.close()


def test_two_clusters_share_one_database_and_never_see_each_others_rows(
        tmp_path: Path, connection: Path) -> None:
    roots = {name: tmp_path / name / "archive" for name in ("alpha", "beta")}
    for name, root in roots.items():
        root.parent.mkdir()
        for n in range(3 if name == "alpha" else 5):
            write_job(root, "carol", str(n + 1))
    alpha, beta = (_index(roots[c], connection, c) for c in ("alpha", "beta"))
    alpha.rebuild()
    beta.rebuild()
    assert len(alpha.jobs()) == 3 and len(beta.jobs()) == 5
    assert alpha.locate("4") == [] and beta.locate("4") == ["carol"]
    alpha.rebuild()  # a cluster's rebuild is its rows alone
    assert len(beta.jobs()) == 5
    assert {i.path.split("/archive/")[0] for i in beta.jobs()} == {str(tmp_path / "beta")}
    alpha.close()
    beta.close()


def test_the_upsert_never_replaces_a_newer_row(root: Path, connection: Path) -> None:
    write_job(root, "dave", "7", age_s=60)
    index = _index(root, connection)
    index.rebuild()
    newest = index.jobs()[0]
    assert os.listdir(root / ".index" / "spool") == []  # the rebuild folded the spool
    write_job(root, "dave", "7", age_s=7200, kinds=("hang", "success"))  # an older record
    assert index.fold() == 1
    [row] = index.jobs()
    assert row.updated_at == newest.updated_at and row.attempts == newest.attempts
    index.close()


def test_a_newer_layout_is_left_alone_and_an_older_one_made_again(
        database: PrivateMariaDb, root: Path, connection: Path) -> None:
    write_job(root, "erin", "1")
    index = _index(root, connection)
    index.rebuild()
    name = next(line.split("=")[1].strip() for line in connection.read_text().splitlines()
                if line.startswith("database"))
    database.sql(f"UPDATE {name}.jobwrap_meta SET v = {SCHEMA + 1} WHERE k = 'layout'")  # noqa: S608
    index.close()
    with pytest.raises(FormatTooNew):
        index.check()
    database.sql(f"UPDATE {name}.jobwrap_meta SET v = {SCHEMA - 1} WHERE k = 'layout'")  # noqa: S608
    with pytest.raises(index_mod.IndexFault, match=f"has layout {SCHEMA - 1}"):
        index.check()
    assert index.rebuild().jobs == 1
    index.check()
    assert [i.job_id for i in index.jobs()] == ["1"]
    index.close()


def _cli(cfg: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--config", cfg, *args])
    return result.exit_code, result.stdout, result.stderr


def test_the_commands_read_it_and_a_database_down_costs_one_line(
        shared: Path, root: Path, connection: Path) -> None:
    for n in range(4):
        write_job(root, "frank", str(n + 1), age_s=(n + 1) * 600)
    cfg = config_file(shared, f'index_backend = "mariadb"\nindex_connection = "{connection}"\n'
                      'cluster = "alpha"\n')
    code, out, err = _cli(cfg, "archive", "list", "--json")
    assert code == 0 and "built it again" in err and err.count("\n") == 1
    listed = json.loads(out)
    assert [i["job_id"] for i in listed] == ["4", "3", "2", "1"]  # oldest first
    code, out, err = _cli(cfg, "archive", "list", "--json")
    assert (code, err) == (0, "") and json.loads(out) == listed
    assert not (root / ".index" / "archive.sqlite").exists()  # the one index is MariaDB's
    down = connection.parent / "down.cnf"
    down.write_text(connection.read_text().replace(f"port = {_port(connection)}",
                                                   f"port = {_free_port()}"))
    os.chmod(down, 0o600)
    cfg = config_file(shared, f'index_backend = "mariadb"\nindex_connection = "{down}"\n')
    code, out, err = _cli(cfg, "archive", "list", "--json")
    assert code == 0 and json.loads(out) == listed  # read from the manifests
    assert err.count("\n") == 1 and "cannot be reached" in err and \
        "reading the manifests instead" in err, err
    os.chmod(connection, 0o644)
    cfg = config_file(shared, f'index_backend = "mariadb"\nindex_connection = "{connection}"\n')
    code, out, err = _cli(cfg, "archive", "list", "--json")
    assert code == 0 and json.loads(out) == listed
    assert f"chmod 600 {connection}" in err and err.count("\n") == 1, err


def _port(connection: Path) -> str:
    return next(line.split("=")[1].strip() for line in connection.read_text().splitlines()
                if line.startswith("port"))


def test_the_cluster_is_slurm_confs_unless_the_config_names_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=gamma\nSlurmctldHost=c\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert cluster_name("") == "gamma" and cluster_name("delta") == "delta"
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "none.conf"))
    assert cluster_name("") == "default"


def test_the_backend_key_picks_the_class(shared: Path) -> None:
    cfg = load(config_file(shared, 'index_backend = "mariadb"\ncluster = "x"\n'))
    picked = index_mod.backend(cfg)
    assert isinstance(picked, MariaDbIndex) and picked.cluster == "x"
    assert picked.connection == "/etc/jobwrap/index.cnf"
    assert isinstance(index_mod.backend(load(config_file(shared))), index_mod.SqliteIndex)


def test_an_ordinary_user_never_connects_and_reads_their_own_rows(
        user: UserIds, shared: Path, root: Path, connection: Path) -> None:
    write_job(root, user.name, "1", gid=user.gid)
    write_job(root, "someone", "2")
    cfg = config_file(shared, f'index_backend = "mariadb"\nindex_connection = "{connection}"\n')
    code, out, _ = _cli(cfg, "archive", "list", "--json")  # root: both, the index built
    assert code == 0 and [i["user"] for i in json.loads(out)] == [user.name, "someone"]

    def as_the_user() -> list[Any]:
        try:
            connection.read_bytes()
            opened = "opened"
        except PermissionError:
            opened = "refused"
        listed = CliRunner().invoke(cli, ["--config", cfg, "archive", "list", "--json"])
        return [opened, index_mod.may_read(str(root)),
                [i["user"] for i in json.loads(listed.stdout)], listed.stderr]

    assert call_as(user, as_the_user) == ["refused", False, [user.name], ""]


def test_doctor_tells_whether_the_database_answers(root: Path, connection: Path,
                                                   shared: Path) -> None:
    from wrapper.doctor import check_index_database

    cfg = load(config_file(shared, f'index_backend = "mariadb"\n'
                                   f'index_connection = "{connection}"\ncluster = "a"\n'))
    assert check_index_database(cfg).status == "pass"
    root.mkdir(exist_ok=True)
    _index(root, connection, "a").rebuild()
    found = check_index_database(cfg)
    assert (found.status, found.detail.endswith("this cluster indexed")) == ("pass", True)
    os.chmod(connection, 0o640)
    found = check_index_database(cfg)
    assert found.status == "fail" and f"chmod 600 {connection}" in found.detail
    assert check_index_database(load(config_file(shared))).detail == "sqlite, on this host"


def test_a_connection_the_server_dropped_is_told_once_then_made_again(
        database: PrivateMariaDb, root: Path, connection: Path) -> None:
    write_job(root, "gina", "1")
    index = _index(root, connection)
    index.rebuild()
    [(own,)] = index._one("SELECT CONNECTION_ID()", ())
    database.sql(f"KILL {int(own)}")
    with pytest.raises(index_mod.IndexDown, match="cannot be read"):
        index.total_size()
    assert index.total_size() > 0 and [i.job_id for i in index.jobs()] == ["1"]
    index.close()
