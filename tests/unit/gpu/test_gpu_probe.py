"""The probe seam and the fake probe: the inventory format, its errors, the round trip."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wrapper.config import GpuConfig
from wrapper.gpu.backend import open_probe
from wrapper.gpu.fake import (
    FakeProbe,
    dump_inventory,
    inventory_path,
    load_inventory,
    parse_inventory,
)
from wrapper.gpu.nvml import NvmlProbe
from wrapper.gpu.probe import (
    ALL_FIELDS,
    HEALTH_FIELDS,
    THROTTLE_REASONS,
    GpuReading,
    ProbeError,
    field_kind,
    normalise_pci_bus_id,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gpu"
HEALTHY = FIXTURES / "healthy-4.toml"
GPU = ('[[gpu]]\nindex = 0\nminor = 0\nuuid = "GPU-aaaa"\nname = "X"\n'
       'pci_bus_id = "0000:18:00.0"\n')
TOP = 'driver_version = "550.54.15"\ncuda_driver_version = "12.4"\n'


def parse(text: str) -> object:
    return parse_inventory(text.encode(), "inv.toml")


def test_the_healthy_fixture_reads_as_four_gpus() -> None:
    inv = load_inventory(str(HEALTHY))
    assert inv.driver_version == "550.54.15"
    assert inv.cuda_driver_version == "12.4"
    assert [g.index for g in inv.gpus] == [0, 1, 2, 3]
    assert inv.gpus[1].pci_bus_id == "0000:2a:00.0"
    assert inv.gpus[0].xid_events == ()
    assert inv.gpus[0].throttle_reasons == ("gpu_idle",)
    assert inv.gpus[0].retired_pages_dbe is None  # absent: not reported


@pytest.mark.parametrize(("text", "expected"), [
    ("00000000:3B:00.0", "0000:3b:00.0"),
    ("0000:3b:00", "0000:3b:00.0"),
    ("3b:00.1", "0000:3b:00.1"),
    ("00010000:c1:1f.0", "00010000:c1:1f.0"),
])
def test_pci_bus_ids_are_normalised(text: str, expected: str) -> None:
    assert normalise_pci_bus_id(text) == expected


def test_a_bad_pci_bus_id_is_refused() -> None:
    with pytest.raises(ValueError, match="not a PCI bus id"):
        normalise_pci_bus_id("slot 3")


def test_every_reading_field_has_a_kind() -> None:
    kinds = {name: field_kind(name) for name in HEALTH_FIELDS}
    assert kinds["xid_events"] == "ints"
    assert kinds["throttle_reasons"] == "strs"
    assert kinds["row_remap_failed"] == "bool"
    assert kinds["serial"] == "str"
    assert kinds["temperature"] == "int"
    assert set(kinds.values()) <= {"int", "str", "bool", "ints", "strs"}


@pytest.mark.parametrize(("text", "expected"), [
    (TOP + GPU + "colour = 3\n", "[[gpu]] #1 (index 0): unknown key 'colour'"),
    (TOP + GPU + 'temperature = "hot"\n', 'temperature = "hot": expected an integer'),
    (TOP + GPU + "xid_events = 79\n", "xid_events = 79: expected an array of integers"),
    (TOP + GPU + "row_remap_failed = 1\n", "row_remap_failed = 1: expected true or false"),
    (TOP + GPU + 'throttle_reasons = ["hot"]\n', "throttle_reasons: unknown hot"),
    (TOP + GPU + "ecc_volatile_uncorrected = -1\n", "expected 0 or more"),
    (TOP + GPU.replace('"0000:18:00.0"', '"slot3"'), "pci_bus_id: 'slot3' is not a PCI bus"),
    (TOP + '[[gpu]]\nindex = 0\nname = "X"\n', "missing minor, uuid, pci_bus_id"),
    (TOP + GPU + GPU.replace("GPU-aaaa", "GPU-bbbb").replace("18:00", "19:00"),
     "two GPUs have index = 0"),
    ('cuda_driver_version = "12.4"\n' + GPU, "driver_version is missing"),
    (TOP + "gpus = []\n", "unknown key 'gpus'; valid top-level keys"),
    (TOP + "format = 2\n", "format = 2: this jobwrap reads format 1"),
    (TOP + "gpu = 3\n", "gpu must be an array of tables"),
    ("[[gpu]\n", "not valid TOML"),
])
def test_a_bad_inventory_names_the_file_and_the_key(text: str, expected: str) -> None:
    with pytest.raises(ProbeError) as info:
        parse(text)
    message = str(info.value)
    assert message.startswith("fake GPU inventory inv.toml: ")
    assert expected in message
    assert "\n" not in message
    assert info.value.kind == "broken"
    assert info.value.exit_code == 2


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ProbeError) as info:
        parse(TOP + GPU + "colour = 3\ntemperature = true\n")
    assert "colour" in str(info.value) and "temperature = true" in str(info.value)


def test_a_missing_inventory_says_where_it_is_set(tmp_path: Path) -> None:
    with pytest.raises(ProbeError, match=r"does not exist \(check \[gpu\] fake_inventory\)"):
        load_inventory(str(tmp_path / "none.toml"))


def test_the_fake_backend_needs_an_inventory() -> None:
    with pytest.raises(ProbeError, match="needs \\[gpu\\] fake_inventory"):
        open_probe(GpuConfig(backend="fake"), "n1")


def test_node_placeholder_picks_each_nodes_inventory(tmp_path: Path) -> None:
    for node, uuid in (("n1", "GPU-1111"), ("n2", "GPU-2222")):
        (tmp_path / f"{node}.toml").write_text(TOP + GPU.replace("GPU-aaaa", uuid))
    config = GpuConfig(backend="fake", fake_inventory=str(tmp_path / "{node}.toml"))
    assert inventory_path(config.fake_inventory, "n2") == str(tmp_path / "n2.toml")
    assert open_probe(config, "n1").devices(set())[0].uuid == "GPU-1111"
    assert open_probe(config, "n2").devices(set())[0].uuid == "GPU-2222"


def test_the_fake_probe_reads_only_the_fields_asked_for() -> None:
    probe = open_probe(GpuConfig(backend="fake", fake_inventory=str(HEALTHY)), "n1")
    assert probe.name == "fake"
    [gpu, *_] = probe.devices({"temperature"})
    assert gpu.temperature == 33
    assert gpu.ecc_volatile_uncorrected is None  # in the file, but not asked for
    assert gpu.uuid.startswith("GPU-0")          # identity is always read
    assert probe.devices(ALL_FIELDS)[0].ecc_volatile_uncorrected == 0
    probe.close()
    probe.close()


def test_a_lost_gpu_and_a_missing_driver_answer_like_nvml(tmp_path: Path) -> None:
    lost = FakeProbe(parse_inventory((TOP + GPU + "lost = true\n").encode(), "x"), "x")
    with pytest.raises(ProbeError) as info:
        lost.devices(ALL_FIELDS)
    assert (info.value.kind, info.value.gpu_index, info.value.exit_code) == ("gpu", 0, 1)
    assert str(info.value).startswith("gpu0: GPU 0000:18:00.0 is lost (fake inventory x")
    no_driver = FakeProbe(parse_inventory(b"driver_loaded = false\n", "y"), "y")
    for call in (no_driver.driver_version, no_driver.cuda_driver_version,
                 lambda: no_driver.devices(())):
        with pytest.raises(ProbeError, match="driver is not loaded") as info:
            call()
        assert info.value.kind == "no-driver"


def test_open_probe_nvml_loads_nothing_until_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The prolog pays for pynvml only when it reads a GPU: opening and closing the probe
    imports nothing of NVML's."""
    import sys

    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    probe = open_probe(GpuConfig(backend="nvml"), "n1")
    assert isinstance(probe, NvmlProbe)
    assert "pynvml" not in sys.modules
    probe.close()  # never initialised: nothing to shut down
    assert "pynvml" not in sys.modules


def test_dump_then_parse_is_the_same_inventory() -> None:
    inv = load_inventory(str(HEALTHY))
    text = dump_inventory(inv.driver_version, inv.cuda_driver_version, inv.gpus,
                          comment="read on\nn1")
    assert text.startswith("# read on n1\n")
    again = parse_inventory(text.encode(), "dumped")
    assert again == inv


_ints = st.integers(min_value=0, max_value=2**40)
_opt_ints = st.none() | _ints
_opt_bool = st.none() | st.booleans()
_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
_readings = st.builds(
    GpuReading,
    index=st.integers(0, 1000), minor=st.integers(0, 1000),
    uuid=_text, name=_text,
    pci_bus_id=st.sampled_from(["0000:18:00.0", "0000:ff:1f.7", "00010000:00:00.0"]),
    serial=st.none() | _text,
    ecc_volatile_uncorrected=_opt_ints, ecc_aggregate_uncorrected=_opt_ints,
    retired_pages_pending=_opt_bool, retired_pages_dbe=_opt_ints, retired_pages_sbe=_opt_ints,
    row_remap_pending=_opt_bool, row_remap_failed=_opt_bool,
    xid_events=st.none() | st.lists(_ints, max_size=4).map(tuple),
    temperature=st.none() | st.integers(-40, 200),
    temperature_slowdown=_opt_ints, temperature_shutdown=_opt_ints,
    throttle_reasons=st.none() | st.lists(st.sampled_from(THROTTLE_REASONS),
                                          max_size=3, unique=True).map(tuple),
    pcie_gen=_opt_ints, pcie_gen_max=_opt_ints, pcie_width=_opt_ints,
    pcie_width_max=_opt_ints, nvlink_links=_opt_ints,
    nvlink_links_down=st.none() | st.lists(_ints, max_size=4).map(tuple),
    persistence_mode=_opt_bool, memory_used_mib=_opt_ints,
    compute_pids=st.none() | st.lists(_ints, max_size=4).map(tuple),
)


@given(reading=_readings, driver=_text, cuda=_text)
def test_any_reading_round_trips(reading: GpuReading, driver: str, cuda: str) -> None:
    text = dump_inventory(driver, cuda, [reading])
    inv = parse_inventory(text.encode(), "dumped")
    assert inv.gpus == (reading,)
    assert (inv.driver_version, inv.cuda_driver_version) == (driver, cuda)


def test_only_keeps_identity() -> None:
    reading = load_inventory(str(HEALTHY)).gpus[0]
    bare = reading.only(())
    assert all(getattr(bare, name) is None for name in HEALTH_FIELDS)
    assert dataclasses.replace(bare, temperature=1).temperature == 1
    assert bare.short_uuid() == reading.uuid[:12]
