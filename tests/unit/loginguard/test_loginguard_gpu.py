"""The guard's GPU seam: which pids use a GPU, from the TOML file of tests or from NVML."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.loginguard.procs import FIXTURES
from wrapper.config import Config, GpuConfig, LoginGuardConfig
from wrapper.loginguard.gpu import GpuProbeError, ProbeGpuPids, TomlGpuPids, gpu_pid_source


def test_the_fixture_lists_no_process_until_a_test_adds_one(tmp_path: Path) -> None:
    assert TomlGpuPids(FIXTURES / "gpus.toml")() == set()
    path = tmp_path / "gpus.toml"
    path.write_text("[[gpu]]\nindex = 0\nprocesses = [11, 12]\n"
                    "[[gpu]]\nindex = 1\nprocesses = [12, 13]\n")
    assert TomlGpuPids(path)() == {11, 12, 13}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[[gpu]]\nprocesses = ['12']\n", "each [[gpu]] needs processes = [PID, ...]"),
        ("[[gpu]]\nprocesses = [true]\n", "each [[gpu]] needs processes = [PID, ...]"),
        ("gpu = 3\n", "expected [[gpu]] tables"),
        ("[[gpu]\n", "cannot read the GPU pid file"),
    ],
)
def test_a_bad_gpu_pid_file_is_a_probe_error(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "gpus.toml"
    path.write_text(text)
    with pytest.raises(GpuProbeError) as info:
        TomlGpuPids(path)()
    assert expected in str(info.value) and str(path) in str(info.value)


def test_a_missing_gpu_pid_file_is_a_probe_error(tmp_path: Path) -> None:
    with pytest.raises(GpuProbeError, match="cannot read the GPU pid file"):
        TomlGpuPids(tmp_path / "absent.toml")()


def test_the_seam_picks_the_file_when_configured_else_the_gpu_probe(tmp_path: Path) -> None:
    configured = Config(login_guard=LoginGuardConfig(gpu_pids_file=str(tmp_path / "g.toml")))
    source = gpu_pid_source(configured)
    assert isinstance(source, TomlGpuPids) and source.path == tmp_path / "g.toml"
    assert isinstance(gpu_pid_source(Config()), ProbeGpuPids)


@pytest.mark.parametrize("code", ["DRIVER_NOT_LOADED", "LIBRARY_NOT_FOUND"])
def test_nvml_without_a_driver_finds_no_gpu_use(monkeypatch: pytest.MonkeyPatch,
                                                code: str) -> None:
    # NVML's own answer on a login node without the driver, whatever this machine has
    import pynvml  # nvidia-ml-py, a dependency of jobwrap
    tries: list[int] = []

    def init() -> None:
        tries.append(1)
        raise pynvml.NVMLError(getattr(pynvml, f"NVML_ERROR_{code}"))

    monkeypatch.setattr(pynvml, "nvmlInit", init)
    probe = ProbeGpuPids(Config(), "login1")
    assert probe() == set()  # no driver: no GPU anyone could be using here
    assert probe() == set() and tries == [1]  # and it is not asked again


def test_nvml_that_fails_otherwise_is_a_probe_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml  # nvidia-ml-py, a dependency of jobwrap

    def init() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)

    monkeypatch.setattr(pynvml, "nvmlInit", init)
    with pytest.raises(GpuProbeError, match="no permission to query the GPUs"):
        ProbeGpuPids(Config(), "login1")()


def test_the_fake_probe_reports_its_compute_processes(tmp_path: Path) -> None:
    inventory = tmp_path / "login1.toml"
    inventory.write_text(
        'format = 1\ndriver_version = "550.54.15"\ncuda_driver_version = "12.4"\n'
        '[[gpu]]\nindex = 0\nminor = 0\nuuid = "GPU-0"\nname = "fake"\n'
        'pci_bus_id = "0000:18:00.0"\ncompute_pids = [4242, 4343]\n')
    config = Config(gpu=GpuConfig(backend="fake", fake_inventory=str(tmp_path / "{node}.toml")))
    assert ProbeGpuPids(config, "login1")() == {4242, 4343}
