"""Version checks against a site baseline: comparisons, NCCL on disk, commands, Fabric Manager."""

from __future__ import annotations

import os
import shlex
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from wrapper.config import Config, GpuConfig, VersionsConfig
from wrapper.errors import ConfigError
from wrapper.gpu.backend import open_probe
from wrapper.gpu.report import Report, run_checks
from wrapper.gpu.versions import (
    at_least,
    find_nccl,
    first_version,
    matches,
    parse_command_spec,
    parse_version,
)

HEALTHY = Path(__file__).resolve().parents[2] / "fixtures" / "gpu" / "healthy-4.toml"
PY = shlex.quote(sys.executable)


def versions(**settings: Any) -> Report:
    cfg = Config(gpu=GpuConfig(backend="fake", fake_inventory=str(HEALTHY)),
                 versions=VersionsConfig(**settings))
    return run_checks(cfg, open_probe(cfg.gpu, "n1"), phase="prolog", allocated=[0],
                      configured_gres=4, env={}, target="versions")


def row(report: Report, name: str) -> tuple[str, str]:
    [found] = [r for r in report.results if r.check == name]
    assert found.gpu_index is None
    return found.status, found.reason


@pytest.mark.parametrize(("found", "minimum", "ok"), [
    ("550.54.15", "535.161.8", True), ("535.161.8", "550", False), ("12.4", "12.4.0", True),
    ("2.18.5", "2.18", True), ("2.9.9", "2.18", False), ("550.54.15", "550.54.15", True),
])
def test_at_least_compares_numbers_not_text(found: str, minimum: str, ok: bool) -> None:
    assert at_least(found, minimum) is ok


def test_matches_accepts_a_more_precise_version() -> None:
    assert matches("12.4.131", "12.4") and not matches("12.40", "12.4")
    with pytest.raises(ValueError, match="not a version"):
        parse_version("v12")


@pytest.mark.parametrize(("output", "version"), [
    ("Cuda compilation tools, release 12.4, V12.4.131\nBuilt on 2024", "12.4"),
    ("Fabric Manager version is : 550.54.15", "550.54.15"),
    ("no numbers here 42", None),
])
def test_first_version_in_output(output: str, version: str | None) -> None:
    assert first_version(output) == version


def test_command_specs() -> None:
    spec = parse_command_spec("/usr/local/cuda/bin/nvcc --version >= 12.2")
    assert (spec.argv, spec.op, spec.version) == (("/usr/local/cuda/bin/nvcc", "--version"),
                                                  ">=", "12.2")
    assert parse_command_spec("'my tool' -V == 1.2").argv == ("my tool", "-V")
    for bad, words in (("nvcc --version", "no ' >= VERSION'"), (" >= 1.2", "no command"),
                       ("nvcc >= twelve", "not a version"), ("'nvcc >= 1", "cannot split")):
        with pytest.raises(ValueError, match=words):
            parse_command_spec(bad)


def test_driver_and_cuda_pass_without_a_baseline_and_say_so() -> None:
    report = versions()
    assert row(report, "driver") == ("pass", "driver 550.54.15 (no baseline set)")
    assert row(report, "cuda") == ("pass", "the driver supports CUDA 12.4 (no baseline set)")
    assert report.verdict == "pass"


@pytest.mark.parametrize(("settings", "check", "status", "words"), [
    ({"driver_min": "535.104"}, "driver", "pass", "driver 550.54.15 (baseline >= 535.104)"),
    ({"driver_min": "555"}, "driver", "fail", "driver 550.54.15 is older than driver_min 555"),
    ({"driver_exact": "550.54.15"}, "driver", "pass", "baseline 550.54.15"),
    ({"driver_exact": "550.54.14"}, "driver", "fail", "but the site runs 550.54.14"),
    ({"cuda_min": "12.2"}, "cuda", "pass", "CUDA 12.4 (>= 12.2)"),
    ({"cuda_min": "12.6"}, "cuda", "fail", "older than cuda_min 12.6"),
])
def test_driver_and_cuda_baselines(settings: dict[str, str], check: str, status: str,
                                   words: str) -> None:
    got_status, reason = row(versions(**settings), check)
    assert got_status == status and words in reason


def test_nccl_is_found_by_file_name(tmp_path: Path) -> None:
    empty, lib = tmp_path / "empty", tmp_path / "lib"
    empty.mkdir()
    lib.mkdir()
    for name in ("libnccl.so.2.18.5", "libnccl.so.2.17.1"):
        (lib / name).write_bytes(b"")
    os.symlink("libnccl.so.2.18.5", lib / "libnccl.so.2")
    paths = (str(tmp_path / "missing"), str(empty), str(lib))
    assert find_nccl(paths) == ("2.18.5", str(lib / "libnccl.so.2.18.5"))
    assert row(versions(nccl_min="2.18", nccl_search_paths=paths), "nccl") == \
        ("pass", f"NCCL 2.18.5 ({lib / 'libnccl.so.2.18.5'})")
    status, reason = row(versions(nccl_min="2.19", nccl_search_paths=paths), "nccl")
    assert status == "fail" and "NCCL 2.18.5" in reason and "older than nccl_min 2.19" in reason


def test_nccl_behind_an_unversioned_link_is_followed(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "libnccl.so.2.21.5").write_bytes(b"")
    links = tmp_path / "links"
    links.mkdir()
    os.symlink(real / "libnccl.so.2.21.5", links / "libnccl.so.2")
    assert find_nccl((str(links),)) == ("2.21.5", str(real / "libnccl.so.2.21.5"))


def test_no_nccl_fails_naming_where_it_looked(tmp_path: Path) -> None:
    status, reason = row(versions(nccl_min="2.18", nccl_search_paths=(str(tmp_path),)), "nccl")
    assert status == "fail" and f"no libnccl.so.* in nccl_search_paths ({tmp_path})" in reason


def test_site_commands_and_their_versions() -> None:
    tool = f"{PY} -c \"print('mytool version 3.2.1')\""
    report = versions(commands=(f"{tool} >= 3.2", f"{tool} == 3.2", f"{tool} >= 4.0",
                                f"{tool} == 3.3", "/nonexistent/tool --version >= 1.0",
                                f"{PY} -c \"print('none')\" >= 1.0"))
    rows = [(r.status, r.reason) for r in report.results if r.check == "commands"]
    name = os.path.basename(sys.executable)
    assert rows[0] == ("pass", f"{name} 3.2.1 (>= 3.2)")
    assert rows[1] == ("pass", f"{name} 3.2.1 (== 3.2)")
    assert rows[2] == ("fail", f"{name} 3.2.1 is older than 4.0")
    assert rows[3] == ("fail", f"{name} 3.2.1, the site expects 3.3")
    assert rows[4][0] == "fail" and "was not found" in rows[4][1]
    assert rows[5][0] == "fail" and "no version in the output" in rows[5][1]
    assert report.verdict == "fail"


def test_a_command_that_hangs_is_cut_off() -> None:
    report = versions(commands=(f"{PY} -c \"import time; time.sleep(30)\" >= 1",),
                      command_timeout=0.3)
    status, reason = row(report, "commands")
    assert status == "fail" and "timed out after 0.3 s" in reason


def _script(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize(("state", "fm_version", "status", "words"), [
    ("active", "550.54.15", "pass", "nvidia-fabricmanager active, version 550.54.15"),
    ("inactive", "550.54.15", "fail", "nvidia-fabricmanager is inactive, not active"),
    ("active", "550.54.14", "fail", "Fabric Manager 550.54.14 differs from the driver 550.54.15"),
])
def test_fabric_manager(tmp_path: Path, state: str, fm_version: str, status: str,
                        words: str) -> None:
    systemctl = _script(tmp_path / "systemctl", f'[ "$1 $2" = "is-active nvidia-fabricmanager" ]'
                        f' && echo {state}')
    fabric = _script(tmp_path / "nv-fabricmanager",
                     f'echo "Fabric Manager version is : {fm_version}"')
    report = versions(fabric_manager=True, systemctl_command=systemctl,
                      fabric_manager_command=fabric)
    got, reason = row(report, "fabric_manager")
    assert got == status and words in reason


def test_fabric_manager_is_off_by_default() -> None:
    assert not [r for r in versions().results if r.check == "fabric_manager"]


def test_bad_baselines_are_config_errors() -> None:
    with pytest.raises(ConfigError) as info:
        versions(driver_min="latest", commands=("nvcc --version",))
    assert "[versions] driver_min: 'latest' is not a version" in str(info.value)
    assert "[versions] commands: 'nvcc --version' has no ' >= VERSION'" in str(info.value)
