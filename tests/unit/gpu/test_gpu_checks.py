"""Each check on fake inventories that pass, warn and fail; the GPU mapping; the report."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from wrapper.config import ChecksConfig, Config, GpuConfig
from wrapper.errors import ConfigError
from wrapper.gpu.backend import open_probe
from wrapper.gpu.checks import REGISTRY, CheckResult
from wrapper.gpu.fake import dump_inventory, load_inventory
from wrapper.gpu.probe import ProbeError
from wrapper.gpu.report import Report, run_checks

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gpu"
HEALTHY = FIXTURES / "healthy-4.toml"


def inventory(path: Path, changes: dict[int, dict[str, Any]] | None = None, *,
              minors: list[int] | None = None) -> Path:
    """The healthy four-GPU node with some fields of some GPUs changed, written to path."""
    inv = load_inventory(str(HEALTHY))
    gpus = []
    for reading in inv.gpus:
        extra: dict[str, Any] = dict((changes or {}).get(reading.index, {}))
        if minors is not None:
            extra["minor"] = minors[reading.index]
        gpus.append(dataclasses.replace(reading, **extra))
    path.write_text(dump_inventory(inv.driver_version, inv.cuda_driver_version, gpus))
    return path


def check(tmp_path: Path, changes: dict[int, dict[str, Any]] | None = None, *,
          phase: str = "prolog", allocated: list[int] | None = None, gres: int | None = 4,
          env: dict[str, str] | None = None, checks: dict[str, Any] | None = None,
          minors: list[int] | None = None, target: str = "gpu") -> Report:
    path = inventory(tmp_path / "inv.toml", changes, minors=minors)
    cfg = Config(gpu=GpuConfig(backend="fake", fake_inventory=str(path)),
                 checks=ChecksConfig(**(checks or {})))
    probe = open_probe(cfg.gpu, "n1")
    try:
        return run_checks(cfg, probe, phase=phase, allocated=allocated, configured_gres=gres,
                          env=env or {}, target=target)
    finally:
        probe.close()


def rows(report: Report, name: str, gpu: int | None = None) -> list[CheckResult]:
    return [r for r in report.results if r.check == name and (gpu is None or r.gpu_index == gpu)]


def test_the_healthy_node_passes_every_check(tmp_path: Path) -> None:
    report = check(tmp_path, allocated=[0, 1, 2, 3], target="all")
    assert report.verdict == "pass", [r for r in report.results if r.status != "pass"]
    assert report.drain_reason() is None
    names = {r.check for r in report.results}
    assert {"count", "mapping", "ecc", "row_remap", "xid", "temperature", "throttle", "pcie",
            "nvlink", "persistence", "in_use", "driver", "cuda"} <= names
    assert len(rows(report, "ecc")) == 4


# (check, changes to gpu 1, extra [checks] config, status of gpu 1, words in its reason)
CASES: list[tuple[str, dict[str, Any], dict[str, Any], str, str]] = [
    ("ecc", {"ecc_aggregate_uncorrected": 0}, {}, "pass", "no uncorrectable"),
    ("ecc", {"ecc_aggregate_uncorrected": 3}, {}, "warn", "3 uncorrectable ECC errors over"),
    ("ecc", {"ecc_volatile_uncorrected": 2}, {}, "fail", "2 uncorrectable ECC errors since"),
    ("ecc", {"ecc_aggregate_uncorrected": 11}, {}, "fail", "above ecc_aggregate_max 10"),
    ("ecc", {"ecc_volatile_uncorrected": None, "ecc_aggregate_uncorrected": None}, {}, "pass",
     "not reported"),
    ("retired_pages", {"retired_pages_pending": False, "retired_pages_dbe": 0,
                       "retired_pages_sbe": 2}, {}, "pass", "2 retired pages, none pending"),
    ("retired_pages", {"retired_pages_pending": False, "retired_pages_dbe": 1,
                       "retired_pages_sbe": 0}, {}, "warn", "1 pages retired for double-bit"),
    ("retired_pages", {"retired_pages_pending": True}, {}, "fail", "retired pages pending"),
    ("retired_pages", {"retired_pages_pending": False, "retired_pages_sbe": 60}, {}, "fail",
     "60 retired pages"),
    ("row_remap", {}, {}, "pass", "no row remapping pending or failed"),
    ("row_remap", {"row_remap_pending": True}, {"row_remap_pending": "warn"}, "warn",
     "row remapping pending"),
    ("row_remap", {"row_remap_pending": True}, {}, "fail", "row remapping pending"),
    ("row_remap", {"row_remap_failed": True}, {}, "fail", "row remapping failed"),
    ("xid", {"xid_events": (13,)}, {}, "pass", "the application's fault"),
    ("xid", {"xid_events": (38, 13)}, {}, "warn", "Xid 38 (driver firmware error); also"),
    ("xid", {"xid_events": (4242,)}, {}, "warn", "Xid 4242 (not in jobwrap's Xid table"),
    ("xid", {"xid_events": (13, 79)}, {}, "fail", "Xid 79 (GPU has fallen off the bus)"),
    ("xid", {"xid_events": (79,)}, {"xid_ignore": ("79",)}, "pass", "no recent Xid"),
    ("xid", {"xid_events": (38,)}, {"xid_drain": ("38",)}, "fail", "Xid 38"),
    ("xid", {"xid_events": None}, {}, "pass", "not available"),
    ("temperature", {"temperature": 60}, {}, "pass", "60 C (slowdown at 87 C)"),
    ("temperature", {"temperature": 83}, {}, "warn", "within 5 C of its slowdown"),
    ("temperature", {"temperature": 87}, {}, "fail", "slowdown threshold 87 C"),
    ("temperature", {"temperature": 95}, {}, "fail", "shutdown threshold 92 C"),
    ("throttle", {"throttle_reasons": ("gpu_idle", "sw_power_cap")}, {}, "pass", "sw_power_cap"),
    ("throttle", {"throttle_reasons": ("sw_thermal_slowdown",)}, {}, "warn",
     "throttled by sw_thermal_slowdown"),
    ("throttle", {"throttle_reasons": ("hw_power_brake_slowdown",)}, {}, "fail",
     "throttled by hw_power_brake_slowdown"),
    ("pcie", {"pcie_gen": 1}, {}, "pass", "gen1, below its gen5 (idle GPUs lower it)"),
    ("pcie", {"pcie_width": 8}, {"pcie_width_below_max": "warn"}, "warn", "x8, below its x16"),
    ("pcie", {"pcie_width": 8}, {}, "fail", "x8, below its x16"),
    ("pcie", {"pcie_gen": 3}, {"pcie_gen_below_max": "fail"}, "fail", "gen3, below its gen5"),
    ("nvlink", {}, {}, "pass", "18 of 18 NVLinks up"),
    ("nvlink", {"nvlink_links_down": (17,)}, {"nvlink_expected": 12}, "warn",
     "17 NVLinks up as expected, but 1 more down (down: 17)"),
    ("nvlink", {"nvlink_links_down": (2, 5)}, {}, "fail", "NVLink 2,5 down (16 of 18 up)"),
    ("nvlink", {"nvlink_links_down": (2, 5)}, {"nvlink_expected": 18}, "fail",
     "16 NVLinks up, 18 expected"),
    ("persistence", {}, {}, "pass", "persistence mode on"),
    ("persistence", {"persistence_mode": False}, {}, "warn", "persistence mode is off"),
    ("persistence", {"persistence_mode": False}, {"persistence_off": "fail"}, "fail",
     "persistence mode is off"),
    ("in_use", {"memory_used_mib": 12}, {}, "pass", "free before the job"),
    ("in_use", {"memory_used_mib": 300}, {}, "warn", "300 MiB of GPU memory in use before"),
    ("in_use", {"memory_used_mib": 2048}, {}, "fail", "above in_use_memory_max_mib 1024"),
    ("in_use", {"compute_pids": (4242, 4343)}, {}, "fail", "2 processes on the GPU before the "
     "job (pids 4242,4343)"),
]


@pytest.mark.parametrize(("name", "changes", "config", "status", "words"), CASES,
                         ids=[f"{c[0]}-{c[3]}-{i}" for i, c in enumerate(CASES)])
def test_each_check_passes_warns_and_fails(tmp_path: Path, name: str, changes: dict[str, Any],
                                           config: dict[str, Any], status: str,
                                           words: str) -> None:
    report = check(tmp_path, {1: changes}, checks=config)
    [row] = rows(report, name, 1)
    assert row.status == status, row
    assert words in row.reason
    assert row.gpu_uuid and row.gpu_uuid.startswith("GPU-1")
    others = [r for r in report.results if r.gpu_index not in (1, None) and r.check == name]
    assert len(others) == 3 and all(r.status == "pass" for r in others)
    assert report.verdict == status


def test_every_check_has_a_case_per_status() -> None:
    covered = {(c[0], c[3]) for c in CASES}
    checked = [name for name, spec in REGISTRY.items()
               if spec.group == "gpu" and name not in ("count", "mapping")]
    assert len(checked) >= 5 and "ecc" in checked, checked  # not vacuous: the checks exist
    for name in checked:
        for status in ("pass", "warn", "fail"):
            assert (name, status) in covered, f"{name} has no {status} case"


def test_a_disabled_check_does_not_run(tmp_path: Path) -> None:
    faults = {1: {"ecc_volatile_uncorrected": 5}}
    assert rows(check(tmp_path, faults), "ecc"), "the ecc check runs when enabled"
    report = check(tmp_path, faults, checks={"ecc": False})
    assert rows(report, "ecc") == []
    assert report.verdict == "pass"


@pytest.mark.parametrize(("phase", "status", "words"), [
    ("prolog", "fail", "before the job"),
    ("epilog", "fail", "after the job"),
    ("check", "pass", "judged only in the prolog and epilog"),
])
def test_in_use_is_judged_by_phase(tmp_path: Path, phase: str, status: str, words: str) -> None:
    report = check(tmp_path, {2: {"compute_pids": (77,), "memory_used_mib": 5000}}, phase=phase)
    [row] = rows(report, "in_use", 2)
    assert row.status == status and words in row.reason


# -- count and mapping --------------------------------------------------------------------

@pytest.mark.parametrize(("gres", "allocated", "status", "words"), [
    (4, [0, 1], "pass", "4 GPUs visible, as Slurm's gres lists"),
    (None, None, "pass", "4 GPUs visible (Slurm's gres not compared)"),
    (3, [0], "warn", "4 GPUs visible but Slurm's gres lists 3"),
    (8, [0], "fail", "only 4 of the 8 GPUs in Slurm's gres are visible (minors 0,1,2,3)"),
])
def test_count_against_gres(tmp_path: Path, gres: int | None, allocated: list[int] | None,
                            status: str, words: str) -> None:
    report = check(tmp_path, gres=gres, allocated=allocated)
    [row] = rows(report, "count")
    assert (row.status, row.gpu_index) == (status, None)
    assert words in row.reason


def test_count_fails_when_more_gpus_are_allocated_than_visible(tmp_path: Path) -> None:
    report = check(tmp_path, allocated=[0, 1, 2, 3, 4])
    assert any(r.status == "fail" and "allocated 5 GPUs but only 4" in r.reason
               for r in rows(report, "count"))


def test_allocated_gpus_map_by_minor_not_by_position(tmp_path: Path) -> None:
    # NVML index 0..3 carry minors 2,0,3,1: Slurm's "1,3" are gpu3 and gpu2, and a fault
    # on gpu1 (minor 0, not allocated) is not this job's business.
    report = check(tmp_path, {1: {"row_remap_failed": True}}, minors=[2, 0, 3, 1],
                   allocated=[1, 3])
    mapping = rows(report, "mapping")
    assert [(r.gpu_index, r.status) for r in mapping] == [(3, "pass"), (2, "pass")]
    assert mapping[0].reason.startswith("Slurm GPU 1 is gpu3 (minor 1, 0000:5d:00.0)")
    assert {r.gpu_index for r in rows(report, "row_remap")} == {2, 3}
    assert report.verdict == "pass"
    # ... and the same fault on an allocated GPU fails.
    report = check(tmp_path, {3: {"row_remap_failed": True}}, minors=[2, 0, 3, 1],
                   allocated=[1, 3])
    assert report.verdict == "fail"
    assert report.drain_reason().startswith("jobwrap: row_remap gpu3(GPU-31a2b3c4): row "
                                            "remapping failed")


def test_allocated_ids_can_be_nvml_indexes(tmp_path: Path) -> None:
    report = check(tmp_path, minors=[2, 0, 3, 1], allocated=[1, 3],
                   checks={"slurm_gpu_ids": "index"})
    assert [r.gpu_index for r in rows(report, "mapping")] == [1, 3]


def test_an_allocated_gpu_that_is_not_visible_fails(tmp_path: Path) -> None:
    report = check(tmp_path, minors=[0, 1, 2, 4], allocated=[3, 4])
    [missing, found] = rows(report, "mapping")
    assert (missing.status, missing.gpu_index) == ("fail", None)
    assert "allocated GPU 3 (minor number 3, from the job's allocation) is not visible; " \
           "visible minor numbers: 0,1,2,4" in missing.reason
    assert (found.status, found.gpu_index) == ("pass", 3)
    assert report.drain_reason().startswith("jobwrap: mapping: allocated GPU 3")


def test_hooks_read_slurm_job_gpus_and_cross_check_cuda_visible_devices(tmp_path: Path) -> None:
    env = {"SLURM_JOB_GPUS": "0,2", "CUDA_VISIBLE_DEVICES": "0,2"}
    report = check(tmp_path, minors=[2, 0, 3, 1], env=env)
    assert [r.gpu_index for r in rows(report, "mapping")] == [1, 0]  # minors 0 and 2
    assert {r.gpu_index for r in rows(report, "ecc")} == {0, 1}
    assert report.verdict == "pass"
    # CUDA_VISIBLE_DEVICES naming other GPUs than SLURM_JOB_GPUS is reported, not drained.
    report = check(tmp_path, env={"SLURM_JOB_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "0,1"})
    [warn] = [r for r in rows(report, "mapping") if r.status == "warn"]
    assert "CUDA_VISIBLE_DEVICES=0,1 names gpu0,gpu1 but SLURM_JOB_GPUS=1,3 names " \
           "gpu1,gpu3" in warn.reason
    assert report.verdict == "warn"


def test_cuda_visible_devices_by_uuid_alone_selects_gpus(tmp_path: Path) -> None:
    report = check(tmp_path, env={"CUDA_VISIBLE_DEVICES": "GPU-21a2b3c4,MIG-abc"})
    assert {r.gpu_index for r in rows(report, "ecc")} == {2}
    assert any(r.status == "warn" and "MIG instance" in r.reason
               for r in rows(report, "mapping"))


def test_a_job_without_gpus_here_checks_none(tmp_path: Path) -> None:
    report = check(tmp_path, {0: {"row_remap_failed": True}}, allocated=[])
    assert rows(report, "row_remap") == []
    assert "no GPU checked" in rows(report, "mapping")[0].reason


def test_outside_a_job_every_gpu_is_checked(tmp_path: Path) -> None:
    report = check(tmp_path, phase="check", env={"SLURM_JOB_GPUS": "1"})
    assert {r.gpu_index for r in rows(report, "ecc")} == {0, 1, 2, 3}


# -- the report ---------------------------------------------------------------------------

def test_drain_reason_names_check_gpu_and_detail_within_120_chars(tmp_path: Path) -> None:
    report = check(tmp_path, {1: {"ecc_volatile_uncorrected": 3}, 2: {"nvlink_links_down": (1,)}})
    reason = report.drain_reason()
    assert reason == ("jobwrap: ecc gpu1(GPU-11a2b3c4): 3 uncorrectable ECC errors since the "
                      "last reset (volatile); reset the GPU (+1 more)")
    long = Report("prolog", (CheckResult("xid", "fail", 7, "GPU-deadbeef-0000", "x" * 300),
                             CheckResult("ecc", "fail", 1, None, "y")))
    text = long.drain_reason()
    assert text is not None and len(text) <= 120
    assert text.startswith("jobwrap: xid gpu7(GPU-deadbeef): xxx")
    assert text.endswith("... (+1 more)")


def test_as_json_is_the_documented_shape(tmp_path: Path) -> None:
    report = check(tmp_path, {0: {"temperature": 85}})
    doc = json.loads(json.dumps(report.as_json()))
    assert set(doc) == {"schema", "phase", "verdict", "drain_reason", "duration_s", "counts",
                        "results"}
    assert (doc["schema"], doc["phase"], doc["verdict"]) == (1, "prolog", "warn")
    assert doc["counts"]["warn"] == 1 and doc["drain_reason"] is None
    assert set(doc["results"][0]) == {"check", "status", "gpu_index", "gpu_uuid", "reason"}


def test_a_lost_gpu_fails_the_probe_with_its_index(tmp_path: Path) -> None:
    path = inventory(tmp_path / "inv.toml")
    path.write_text(path.read_text().replace("index = 2\n", "index = 2\nlost = true\n"))
    cfg = Config(gpu=GpuConfig(backend="fake", fake_inventory=str(path)))
    report = run_checks(cfg, open_probe(cfg.gpu, "n1"), phase="epilog", allocated=None,
                        configured_gres=4, env={})
    [row] = report.results
    assert (row.check, row.status, row.gpu_index) == ("probe", "fail", 2)
    assert report.drain_reason().startswith("jobwrap: probe gpu2: GPU 0000:3a:00.0 is lost "
                                            "(fake inventory ")


def test_bad_check_settings_are_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        check(tmp_path, checks={"xid_drain": ("79", "oops"), "throttle_fail": ("melting",)})
    message = str(info.value)
    assert "[checks] xid_drain: 'oops' is not an Xid number" in message
    assert "[checks] throttle_fail: unknown throttle reason 'melting'" in message


def test_a_slow_check_warns_over_its_budget(tmp_path: Path) -> None:
    path = inventory(tmp_path / "inv.toml")
    cfg = Config(gpu=GpuConfig(backend="fake", fake_inventory=str(path)),
                 checks=ChecksConfig(check_budget=5.0))
    ticks = iter(float(i) * 6 for i in range(1000))  # every look at the clock: 6 s later
    report = run_checks(cfg, open_probe(cfg.gpu, "n1"), phase="prolog", allocated=[0],
                        configured_gres=4, env={}, target="gpu", clock=lambda: next(ticks))
    slow = [r for r in report.results if "over its [checks] check_budget of 5 s" in r.reason]
    assert slow and all(r.status == "warn" for r in slow)
    assert report.verdict == "warn"


def test_a_hung_probe_is_a_timeout_not_a_gpu_fault(tmp_path: Path) -> None:
    import threading

    from wrapper.gpu.report import read_probe

    release = threading.Event()

    class Hung:
        name = "hung"

        def driver_version(self) -> str:
            return "1"

        def cuda_driver_version(self) -> str:
            return "1"

        def devices(self, fields: object) -> list[Any]:
            release.wait(5)
            return []

        def close(self) -> None:
            """Nothing to release."""

    with pytest.raises(ProbeError) as info:
        read_probe(Hung(), (), devices=True, versions=False, budget=0.05)
    release.set()
    assert info.value.kind == "timeout" and info.value.exit_code == 2
    assert "did not answer within [checks] probe_budget = 0.05 s" in str(info.value)


def test_unknown_phase_or_target_is_a_programming_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="phase must be one of"):
        check(tmp_path, phase="job")
    with pytest.raises(ValueError, match="target must be one of"):
        check(tmp_path, target="gpus")
