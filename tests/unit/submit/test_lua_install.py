"""``jobwrap install-lua``: the site defaults from the config, written atomically."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.fixtures.lua import luarun
from wrapper import config
from wrapper.cli import cli
from wrapper.submit import lua as install_lua
from wrapper.submit.lua import (
    InstallError,
    SiteDefaults,
    install,
    render,
    signal_of,
    template,
)


def _site_value(text: str, key: str) -> str:
    match = re.search(rf"^\s+{key} = (.*),$", text, re.M)
    assert match, key
    return match.group(1)


def test_the_template_holds_the_default_site() -> None:
    text = template()
    assert render(SiteDefaults()) == text
    assert _site_value(text, "signal_number") == "23"  # URG


def test_site_from_the_config(tmp_path: Path) -> None:
    path = tmp_path / "jobwrap.toml"
    path.write_text('[supervisor]\nwalltime_signal = "SIGUSR2"\nwalltime_lead = 120.4\n'
                    "[restart]\nmax_restarts = 7\nmax_restarts_limit = 9\n")
    site = SiteDefaults.from_config(config.load(str(path)))
    assert site == SiteDefaults(requeue=True, max_restarts=7, max_restarts_limit=9,
                                signal_name="USR2", signal_number=12, signal_lead=120)
    text = render(site, str(path))
    assert _site_value(text, "max_restarts") == "7"
    assert _site_value(text, "max_restarts_limit") == "9"
    assert _site_value(text, "signal_name") == '"USR2"'
    assert f"written by `jobwrap install-lua` from {path}" in text
    # Only the SITE block changed.
    assert text.split("-- END SITE")[1] == template().split("-- END SITE")[1]


@pytest.mark.parametrize(("text", "expected"), [
    ("USR1", ("USR1", 10)), ("sigterm", ("TERM", 15)), ("12", ("USR2", 12)),
    (" INT ", ("INT", 2)),
])
def test_signal_names(text: str, expected: tuple[str, int]) -> None:
    assert signal_of(text) == expected


@pytest.mark.parametrize("text", ["USR9", "", "B:USR1", "999"])
def test_bad_signals_name_the_key(text: str) -> None:
    with pytest.raises(InstallError, match=r"\[supervisor\] walltime_signal"):
        signal_of(text)


def test_a_lead_slurm_cannot_hold(tmp_path: Path) -> None:
    path = tmp_path / "jobwrap.toml"
    path.write_text("[supervisor]\nwalltime_lead = 70000\n")
    with pytest.raises(InstallError, match="at most 65533 s"):
        SiteDefaults.from_config(config.load(str(path)))


def test_install_into_a_folder_replaces_atomically(tmp_path: Path) -> None:
    old = tmp_path / "job_submit.lua"
    old.write_text("-- the admin's old plugin\n")
    inode = old.stat().st_ino
    target = install(tmp_path, "return 0\n")
    assert target == old
    assert target.read_text() == "return 0\n"
    assert target.stat().st_ino != inode  # a new file renamed over, never rewritten in place
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job_submit.lua"]


def test_a_failed_write_leaves_no_temp_file(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # The rename fails after the temp file was written beside the target: it is removed,
    # and the caller sees the rename's own error (the CLI turns it into "cannot write").
    made: list[str] = []
    real_mkstemp = install_lua.tempfile.mkstemp

    def mkstemp(*args: object, **kwargs: object) -> tuple[int, str]:
        fd, name = real_mkstemp(*args, **kwargs)  # type: ignore[call-overload]
        made.append(name)
        return fd, name

    def replace(src: str, dst: object) -> None:
        assert os.path.exists(src)  # the failure comes after the temp file exists
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(install_lua.tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(install_lua.os, "replace", replace)
    with pytest.raises(OSError, match="No space left on device"):
        install(tmp_path / "job_submit.lua", "x")
    assert len(made) == 1 and Path(made[0]).parent == tmp_path
    assert list(tmp_path.iterdir()) == []
    cfg = tmp_path.parent / f"{tmp_path.name}.toml"
    cfg.write_text("")
    result = CliRunner().invoke(cli, ["--config", str(cfg), "install-lua", str(tmp_path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"cannot write {tmp_path}: No space left on device" in result.output
    assert len(made) == 2 and list(tmp_path.iterdir()) == []


def test_cli_writes_a_plugin_that_runs(tmp_path: Path) -> None:
    cfg = tmp_path / "jobwrap.toml"
    cfg.write_text("[restart]\nmax_restarts = 0\nmax_restarts_limit = 4\n")
    out = tmp_path / "etc"
    out.mkdir()
    # the limit is the config's, which root's hooks read too: a flag that differs is
    # refused, saying where to set it, and nothing is written
    result = CliRunner().invoke(cli, ["--config", str(cfg), "install-lua", str(out),
                                      "--max-restarts-limit", "6"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "differs from the config's [restart] max_restarts_limit = 4" in result.output
    assert list(out.iterdir()) == []
    result = CliRunner().invoke(cli, ["--config", str(cfg), "install-lua", str(out),
                                      "--max-restarts-limit", "4"])
    assert result.exit_code == 0, result.output
    assert f"installed {out / 'job_submit.lua'}" in result.output
    plugin = out / "job_submit.lua"
    lua = luarun.require(luarun.interpreter_params()[0])
    plain, over = luarun.run_cases([
        luarun.submit_case("#!/bin/sh\ntrue\n"),
        luarun.submit_case("#!/bin/sh\n#JOBWRAP --max-restarts=5\ntrue\n"),
    ], tmp_path, lua=lua, plugin=plugin)
    assert "set" not in plain  # max_restarts = 0: jobs are not made requeueable
    assert over["user_msg"].endswith("this cluster allows at most 4 restarts")


def test_cli_prints_with_a_dash(tmp_path: Path) -> None:
    cfg = tmp_path / "jobwrap.toml"
    cfg.write_text("")
    result = CliRunner().invoke(cli, ["--config", str(cfg), "install-lua", "-",
                                      "--no-requeue-default"])
    assert result.exit_code == 0, result.output
    assert _site_value(result.output, "requeue") == "false"
    assert "function slurm_job_submit" in result.output


def test_cli_reports_an_unwritable_path(tmp_path: Path) -> None:
    cfg = tmp_path / "jobwrap.toml"
    cfg.write_text("")
    result = CliRunner().invoke(cli, ["--config", str(cfg), "install-lua",
                                      str(tmp_path / "nope" / "job_submit.lua")])
    assert result.exit_code == 2
    assert "cannot write" in result.output
    assert not os.path.exists(tmp_path / "nope")


def test_the_sites_default_spares_are_checked_before_they_reach_the_plugin() -> None:
    from wrapper.submit.lua import InstallError, spare_defaults

    assert spare_defaults(" gpu = 1, big=2 ,") == "gpu=1,big=2"
    assert spare_defaults("") == ""
    for bad in ("gpu", "gpu=x", "gpu=65", "=1", "gpu=1,big"):
        with pytest.raises(InstallError, match="is not PART=N"):
            spare_defaults(bad)
