"""``jobwrap install`` into a temporary tree as an admin runs it (root): everything a role
needs is placed, a second run changes nothing, ``uninstall`` gives back the tree byte for
byte; what it cannot do safely stops it before anything is written."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from wrapper import config
from wrapper.cli import cli
from wrapper.install import installer
from wrapper.install.slurmconf import SlurmConfError

SLURM_CONF = """ClusterName=t
SlurmctldHost=ctl(127.0.0.1)
SchedulerParameters=bf_continue
NodeName=n[1-2] NodeHostname=box CPUs=2
PartitionName=debug Nodes=ALL Default=YES
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    os.chmod(tmp_path, 0o755)  # noqa: S103 - as /opt is
    (tmp_path / "etc" / "slurm").mkdir(parents=True)
    (tmp_path / "etc" / "slurm" / "slurm.conf").write_text(SLURM_CONF)
    (tmp_path / "etc" / "jobwrap").mkdir()
    (tmp_path / "etc" / "jobwrap" / "config.toml").write_text(f"""[paths]
state_dir = "{tmp_path}/nodes/{{node}}/state"
scratch_root = "{tmp_path}/nodes/{{node}}/scratch"
cache_root = "{tmp_path}/nodes/{{node}}/cache"
archive_root = "{tmp_path}/archive"
[log]
file = "{tmp_path}/nodes/{{node}}/log/jobwrap.log"
""")
    return tmp_path


def _plan(tree: Path, roles: tuple[str, ...] = ("compute", "controller"),
          config_path: Path | None = None) -> installer.Plan:
    return installer.plan(roles=roles, prefix=tree / "opt", config_path=config_path or (
        tree / "etc" / "jobwrap" / "config.toml"), slurm_conf=tree / "etc" / "slurm" /
        "slurm.conf", systemd_dir=tree / "units", program=Path("/opt/jobwrap/venv/bin/jobwrap"),
        host="box")


def _snapshot(root: Path) -> dict[str, tuple[int, str]]:
    out = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        body = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        out[str(path.relative_to(root))] = (stat.S_IMODE(info.st_mode), body)
    return out


def test_a_compute_and_controller_install_places_what_each_needs(tree: Path) -> None:
    done = installer.apply(_plan(tree))
    opt = tree / "opt"
    for hook in ("prolog/prolog", "prolog/task-prolog", "prolog/healthcheck",
                 "epilog/epilog"):
        assert stat.S_IMODE((opt / hook).stat().st_mode) == 0o755, hook
    assert stat.S_IMODE((opt / "prolog" / "hook-env.sh").stat().st_mode) == 0o644
    env = (opt / "jobwrap.env").read_text()
    assert "JOBWRAP_BIN=/opt/jobwrap/venv/bin/jobwrap\n" in env
    assert f"JOBWRAP_CONFIG={tree}/etc/jobwrap/config.toml\n" in env
    assert f"SLURM_CONF={tree}/etc/slurm/slurm.conf\n" in env
    conf = (tree / "etc" / "slurm" / "slurm.conf").read_text()
    assert f"Prolog={opt}/prolog/prolog\n" in conf and "bf_continue,nohold_on_prolog_fail" \
        in conf
    assert "-- BEGIN SITE" in (tree / "etc" / "slurm" / "job_submit.lua").read_text()
    for node in ("n1", "n2"):  # each node of this host its own folders, as the config says
        assert stat.S_IMODE((tree / "nodes" / node / "cache").stat().st_mode) == 0o700
        assert stat.S_IMODE((tree / "nodes" / node / "log").stat().st_mode) == 0o750
    assert stat.S_IMODE((tree / "archive").stat().st_mode) == 0o711
    assert sorted(p.name for p in (tree / "units").iterdir()) == [
        "jobwrap-indexer.service", "jobwrap-indexer.timer", "jobwrap-supervisor@.service"]
    unit = (tree / "units" / "jobwrap-supervisor@.service").read_text()
    assert f". {opt}/prolog/hook-env.sh" in unit and "/opt/jobwrap/prolog" not in unit
    indexer = (tree / "units" / "jobwrap-indexer.service").read_text()
    assert f"Environment=JOBWRAP_CONFIG={tree}/etc/jobwrap/config.toml" in indexer
    record = json.loads((opt / "install.json").read_text())
    assert record["roles"] == ["compute", "controller"] and len(record["files"]) == 11
    assert any(line.startswith("wrote") for line in done)


def test_a_second_install_changes_nothing(tree: Path) -> None:
    installer.apply(_plan(tree))
    before = _snapshot(tree)
    again = _plan(tree)
    assert not again.changes and installer.diff(again) == ""
    assert installer.apply(again) == []
    assert _snapshot(tree) == before


def test_uninstall_gives_the_tree_back_byte_for_byte(tree: Path) -> None:
    before = _snapshot(tree)
    installer.apply(_plan(tree))
    installer.apply(_plan(tree, ("login",)))  # a role added later is in the same record
    assert (tree / "units" / "jobwrap-login-guard.service").exists()
    undone = installer.uninstall(tree / "opt", purge=True)
    assert any("the archive, kept" in k for k in undone.kept)
    after = _snapshot(tree)
    assert {k: v for k, v in after.items() if not k.startswith("archive")} == before


def test_uninstall_keeps_data_unless_purged_and_what_the_site_changed(tree: Path) -> None:
    installer.apply(_plan(tree))
    (tree / "nodes" / "n1" / "state" / "job-7").mkdir()
    conf = tree / "etc" / "slurm" / "slurm.conf"
    conf.write_text(conf.read_text().replace("ClusterName=t", "ClusterName=t2"))
    (tree / "opt" / "prolog" / "prolog").write_text("#!/bin/sh\n# the site's own now\n")
    undone = installer.uninstall(tree / "opt")
    assert conf.read_text() == SLURM_CONF.replace("ClusterName=t", "ClusterName=t2")
    assert (tree / "nodes" / "n1" / "state" / "job-7").is_dir()
    assert f"{tree}/opt/prolog/prolog: changed since install; left as it is" in undone.kept
    assert (tree / "opt" / "prolog" / "prolog").exists()
    assert not (tree / "opt" / "install.json").exists()
    with pytest.raises(installer.InstallError, match="no install record"):
        installer.uninstall(tree / "opt")


def test_an_absent_config_is_written_with_every_key_commented(tree: Path) -> None:
    path = tree / "etc" / "jobwrap" / "new.toml"
    plan = _plan(tree, ("login",), config_path=path)
    installer.apply(plan)
    text = path.read_text()
    assert tomllib.loads(text) == {s: {} for s in tomllib.loads(text)}  # sets nothing
    assert "# state_dir = " in text
    assert config.load(str(path)).paths.state_dir == config.Config().paths.state_dir
    path.write_text('[log]\nlevel = "debug"\n')
    assert not any(f.changes for f in _plan(tree, ("login",), config_path=path).files
                   if f.path == path)  # the site's file now: never replaced
    installer.uninstall(tree / "opt")
    assert path.read_text() == '[log]\nlevel = "debug"\n'


def test_a_slurm_conf_it_cannot_merge_changes_nothing(tree: Path) -> None:
    conf = tree / "etc" / "slurm" / "slurm.conf"
    conf.write_text(SLURM_CONF + "Prolog=/usr/sbin/site-prolog\n")
    before = _snapshot(tree)
    with pytest.raises(SlurmConfError, match="Slurm runs one Prolog unless it names a folder"):
        _plan(tree)
    assert _snapshot(tree) == before


def test_a_sites_own_job_submit_lua_is_not_replaced(tree: Path) -> None:
    lua = tree / "etc" / "slurm" / "job_submit.lua"
    lua.write_text("function slurm_job_submit() return slurm.SUCCESS end\n")
    with pytest.raises(installer.InstallError, match=r"the site.s own job_submit\.lua"):
        _plan(tree)


def test_a_folder_users_can_write_is_no_place_for_roots_hooks(tree: Path) -> None:
    shared = tree / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # noqa: S103 - the attack
    with pytest.raises(installer.InstallError, match="can be changed by users other than root"):
        installer.plan(roles=["compute"], prefix=shared / "opt", config_path=tree / "etc" /
                       "jobwrap" / "config.toml", slurm_conf=None, systemd_dir=tree / "u",
                       program=Path("/usr/bin/jobwrap"), host="box")
    with pytest.raises(installer.InstallError, match="plain characters"):
        installer.plan(roles=["compute"], prefix=Path("/opt/job wrap"), config_path=tree /
                       "c.toml", slurm_conf=None, systemd_dir=tree / "u",
                       program=Path("/usr/bin/jobwrap"), host="box")


def test_a_link_where_a_file_goes_is_refused(tree: Path) -> None:
    (tree / "opt" / "prolog").mkdir(parents=True)
    (tree / "opt" / "prolog" / "prolog").symlink_to("/etc/passwd")
    with pytest.raises(installer.InstallError, match="not a regular file"):
        _plan(tree)


def test_roles_are_read_from_slurm_conf(tree: Path) -> None:
    conf = tree / "etc" / "slurm" / "slurm.conf"
    assert installer.detect_roles(conf, "box") == ["compute"]
    assert installer.detect_roles(conf, "ctl") == ["controller"]
    assert installer.detect_roles(conf, "login1") == ["login"]


def test_the_command_shows_a_dry_run_as_diffs_and_writes_nothing(tree: Path) -> None:
    before = _snapshot(tree)
    res = CliRunner().invoke(cli, ["--config", str(tree / "etc/jobwrap/config.toml"), "install",
                                   "--role", "compute", "--prefix", str(tree / "opt"),
                                   "--slurm-conf", str(tree / "etc/slurm/slurm.conf"),
                                   "--systemd-dir", str(tree / "units"), "--host", "box",
                                   "--dry-run"])
    assert res.exit_code == 0, res.output
    assert f"+++ {tree}/etc/slurm/slurm.conf" in res.output
    assert "+SchedulerParameters=bf_continue,nohold_on_prolog_fail" in res.output
    assert f"mkdir -m 0700 {tree}/nodes/n1/cache" in res.output
    assert _snapshot(tree) == before
    res = CliRunner().invoke(cli, ["install", "--slurm-conf", str(tree / "nope.conf"),
                                   "--prefix", "relative", "--dry-run"])
    assert res.exit_code == 2 and "jobwrap: error: --prefix relative: give an absolute" in \
        res.output


def test_a_record_from_a_newer_jobwrap_is_not_guessed_at(tree: Path) -> None:
    (tree / "opt").mkdir()
    (tree / "opt" / "install.json").write_text('{"format": 99}')
    with pytest.raises(installer.InstallError, match="written by a newer jobwrap"):
        installer.uninstall(tree / "opt")


def test_a_slurm_conf_reached_through_a_link_is_edited_where_it_lives(tree: Path) -> None:
    managed = tree / "managed"
    managed.mkdir()
    real = managed / "slurm.conf"
    (tree / "etc" / "slurm" / "slurm.conf").rename(real)
    link = tree / "etc" / "slurm" / "slurm.conf"
    link.symlink_to(real)
    res = CliRunner().invoke(cli, ["--config", str(tree / "etc/jobwrap/config.toml"), "install",
                                   "--role", "compute", "--prefix", str(tree / "opt"),
                                   "--slurm-conf", str(link), "--systemd-dir",
                                   str(tree / "units"), "--host", "box", "--no-doctor"])
    assert res.exit_code == 0, res.output
    assert link.is_symlink() and "Prolog=" in real.read_text()
    # where slurmctld looks for it: beside the slurm.conf it is given, not the link's target
    assert (link.parent / "job_submit.lua").exists() and not (managed / "job_submit.lua"
                                                              ).exists()
    assert f"SLURM_CONF={link}\n" in (tree / "opt" / "jobwrap.env").read_text()
    installer.uninstall(tree / "opt")
    assert link.is_symlink() and real.read_text() == SLURM_CONF


def test_a_sites_folder_of_prologs_gets_jobwraps_and_doctor_follows_it(tree: Path) -> None:
    from wrapper.doctor import diagnose

    folder = tree / "etc" / "slurm" / "prolog.d"
    folder.mkdir()
    (folder / "10-site").write_text("#!/bin/sh\nexit 0\n")
    conf = tree / "etc" / "slurm" / "slurm.conf"
    conf.write_text(SLURM_CONF + f"Prolog={folder}/*\n")
    installer.apply(_plan(tree))
    shim = folder / "jobwrap-prolog"
    assert shim.read_text().endswith(f"exec {tree}/opt/prolog/prolog\n")
    assert f"Prolog={folder}/*\n" in conf.read_text()  # the site's value, kept
    findings, _ = diagnose(config_path=str(tree / "etc/jobwrap/config.toml"),
                           slurm_conf=str(conf), node="n1")
    [prolog] = [f for f in findings if f.check == "slurm.prolog"]
    assert (prolog.status, prolog.detail) == ("pass", f"Prolog={tree}/opt/prolog/prolog runs "
                                                      "`jobwrap prolog`")
    installer.uninstall(tree / "opt")
    assert not shim.exists() and (folder / "10-site").exists()


def test_uninstall_after_a_second_install_keeps_what_the_site_changed_between(
        tree: Path) -> None:
    conf = tree / "etc" / "slurm" / "slurm.conf"
    installer.apply(_plan(tree))
    edited = conf.read_text().replace("PartitionName=debug", "NodeName=n9 CPUs=1\n"
                                      "PartitionName=debug").replace("JobRequeue=1\n", "")
    conf.write_text(edited)
    installer.apply(_plan(tree))  # an upgrade: JobRequeue=1 is added again, in the block
    text = conf.read_text()
    assert text.count("# jobwrap: added by") == 1 and "JobRequeue=1\n" in text
    installer.uninstall(tree / "opt")
    assert conf.read_text() == SLURM_CONF.replace("PartitionName=debug",
                                                  "NodeName=n9 CPUs=1\nPartitionName=debug")


def test_a_failure_part_way_leaves_a_record_uninstall_takes_out(
        tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk when slurm.conf is written (the hooks are in by then): one message, and
    the uninstall takes out all that was done."""
    before = _snapshot(tree)
    conf = tree / "etc" / "slurm" / "slurm.conf"
    real_write = installer.atomic_write

    def full_disk(path: object, data: bytes, **kwargs: object) -> None:
        if Path(str(path)) == conf:
            raise OSError(28, "No space left on device", str(path))
        real_write(path, data, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(installer, "atomic_write", full_disk)
    with pytest.raises(installer.InstallError, match=r"No space left on device; what was "
                       r"done so far is in .*install\.json, and `jobwrap uninstall` takes"):
        installer.apply(_plan(tree))
    assert (tree / "opt" / "prolog" / "prolog").exists() and conf.read_text() == SLURM_CONF
    monkeypatch.undo()
    undone = installer.uninstall(tree / "opt", purge=True)
    assert any("the archive, kept" in k for k in undone.kept)
    assert {k: v for k, v in _snapshot(tree).items() if not k.startswith("archive")} == before


def test_the_sites_owner_of_slurm_conf_stays(tree: Path) -> None:
    conf = tree / "etc" / "slurm" / "slurm.conf"
    os.chown(conf, 65534, 65534)
    os.chmod(conf, 0o640)
    installer.apply(_plan(tree))
    info = conf.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (65534, 65534, 0o640)
    installer.uninstall(tree / "opt")
    assert (conf.stat().st_uid, conf.read_text()) == (65534, SLURM_CONF)


def test_a_folder_of_prologs_that_does_not_exist_stops_before_anything(tree: Path) -> None:
    conf = tree / "etc" / "slurm" / "slurm.conf"
    conf.write_text(SLURM_CONF + f"Prolog={tree}/nowhere/*\n")
    with pytest.raises(installer.InstallError, match="which does not exist: make it"):
        _plan(tree)


def test_a_link_into_a_folder_users_can_write_is_no_place_either(tree: Path) -> None:
    """The link's target is root's, but the folder it sits in is anyone's: a user renames
    it away and puts their own there."""
    shared = tree / "shared"
    (shared / "inner").mkdir(parents=True)
    os.chmod(shared, 0o777)  # noqa: S103 - the attack
    (tree / "opt-link").symlink_to(shared / "inner")
    with pytest.raises(installer.InstallError, match=f"{shared} can be changed by users"):
        installer.plan(roles=["compute"], prefix=tree / "opt-link" / "jw", config_path=tree /
                       "etc" / "jobwrap" / "config.toml", slurm_conf=None,
                       systemd_dir=tree / "u", program=Path("/usr/bin/jobwrap"), host="box")
