"""The fake probe: a node's GPUs described in a TOML inventory, read as NVML would read them.

It is a full probe, not a mock: tests, dry runs and the local Slurm cluster run the real
checks on it, and ``jobwrap check gpu --dump-inventory`` writes a real node's readings in
this format so they can be replayed. The format (every health key optional: a missing key
is a field the GPU does not report)::

    format = 1
    driver_version = "550.54.15"
    cuda_driver_version = "12.4"
    # driver_loaded = false   makes the probe answer as NVML does without a driver

    [[gpu]]
    index = 0
    minor = 0
    uuid = "GPU-1a2b3c4d-0000-1111-2222-333344445555"
    name = "NVIDIA H100 80GB HBM3"
    pci_bus_id = "0000:18:00.0"
    ecc_volatile_uncorrected = 0
    row_remap_failed = false
    xid_events = [79]
    throttle_reasons = ["gpu_idle"]
    # lost = true             makes the probe answer "GPU is lost" for this GPU

``{node}`` in ``[gpu] fake_inventory`` is replaced with the Slurm node name, so several
nodes on one host (the test cluster's n1 and n2) each read their own inventory.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

from wrapper.fastdataclass import dataclass
from wrapper.gpu.probe import (
    HEALTH_FIELDS,
    IDENTITY_FIELDS,
    THROTTLE_REASONS,
    GpuReading,
    ProbeError,
    field_kind,
    normalise_pci_bus_id,
)

if TYPE_CHECKING:
    from wrapper.config import GpuConfig

FORMAT = 1
_TOP_KEYS = ("format", "driver_version", "cuda_driver_version", "driver_loaded", "gpu")
_GPU_KEYS = (*IDENTITY_FIELDS, *HEALTH_FIELDS, "lost")
_KIND_NAMES = {"int": "an integer", "str": "a string", "bool": "true or false",
               "ints": "an array of integers", "strs": "an array of strings"}


@dataclass(frozen=True)
class Inventory:
    driver_version: str
    cuda_driver_version: str
    driver_loaded: bool
    gpus: tuple[GpuReading, ...]
    lost: frozenset[int]  # indexes of GPUs that answer "GPU is lost"


def inventory_path(template: str, node: str) -> str:
    """``[gpu] fake_inventory`` with ``{node}`` replaced by the Slurm node name."""
    return template.replace("{node}", node)


def load_inventory(path: str) -> Inventory:
    """Read and validate an inventory; every problem is reported at once, with its key."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise _error(path, ["the file does not exist (check [gpu] fake_inventory)"]) from None
    except OSError as exc:
        raise _error(path, [f"cannot read the file: {exc.strerror}"]) from None
    return parse_inventory(raw, path)


def parse_inventory(raw: bytes, path: str) -> Inventory:
    import tomllib

    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise _error(path, ["the file is not UTF-8 text"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise _error(path, [f"not valid TOML: {exc}"]) from None
    problems: list[str] = []
    for key in data:
        if key not in _TOP_KEYS:
            problems.append(f"unknown key {key!r}; valid top-level keys: {', '.join(_TOP_KEYS)}")
    fmt = data.get("format", FORMAT)
    if fmt != FORMAT:
        problems.append(f"format = {_show(fmt)}: this jobwrap reads format {FORMAT}")
    loaded = data.get("driver_loaded", True)
    if not isinstance(loaded, bool):
        problems.append(f"driver_loaded = {_show(loaded)}: expected true or false")
        loaded = True
    versions = {}
    for key in ("driver_version", "cuda_driver_version"):
        value = data.get(key)
        if value is None:
            if loaded:
                problems.append(f"{key} is missing (a string such as "
                                f"{'550.54.15' if key == 'driver_version' else '12.4'})")
            value = ""
        elif not isinstance(value, str):
            problems.append(f"{key} = {_show(value)}: expected a string")
            value = ""
        versions[key] = value
    tables = data.get("gpu", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        problems.append("gpu must be an array of tables ([[gpu]] sections)")
        tables = []
    gpus: list[GpuReading] = []
    lost: set[int] = set()
    for number, table in enumerate(tables, start=1):
        reading, is_lost = _parse_gpu(table, f"[[gpu]] #{number}", problems)
        if reading is not None:
            gpus.append(reading)
            if is_lost:
                lost.add(reading.index)
    for key in ("index", "minor", "uuid", "pci_bus_id"):
        seen: dict[object, int] = {}
        for reading in gpus:
            value = getattr(reading, key)
            if value in seen:
                problems.append(f"two GPUs have {key} = {_show(value)} (gpu index "
                                f"{seen[value]} and {reading.index}); each must be unique")
            seen[value] = reading.index
    if problems:
        raise _error(path, problems)
    return Inventory(driver_version=versions["driver_version"],
                     cuda_driver_version=versions["cuda_driver_version"],
                     driver_loaded=loaded, gpus=tuple(sorted(gpus, key=lambda r: r.index)),
                     lost=frozenset(lost))


def _parse_gpu(table: dict[str, Any], where: str,
               problems: list[str]) -> tuple[GpuReading | None, bool]:
    values: dict[str, Any] = {}
    before = len(problems)
    label = f"{where} (index {table['index']})" if isinstance(table.get("index"), int) \
        else where
    for key, value in table.items():
        if key not in _GPU_KEYS:
            problems.append(f"{label}: unknown key {key!r}; valid keys: "
                            f"{', '.join(_GPU_KEYS)}")
            continue
        kind = "bool" if key == "lost" else field_kind(key)
        if not _is_kind(value, kind):
            problems.append(f"{label}: {key} = {_show(value)}: expected {_KIND_NAMES[kind]}")
            continue
        if key == "pci_bus_id":
            try:
                value = normalise_pci_bus_id(value)
            except ValueError as exc:
                problems.append(f"{label}: {key}: {exc}")
                continue
        elif key == "throttle_reasons":
            unknown = [v for v in value if v not in THROTTLE_REASONS]
            if unknown:
                problems.append(f"{label}: throttle_reasons: unknown {', '.join(unknown)}; "
                                f"known: {', '.join(THROTTLE_REASONS)}")
                continue
        elif kind in ("int", "ints") and key not in ("temperature",):
            numbers = value if kind == "ints" else [value]
            if any(n < 0 for n in numbers):
                problems.append(f"{label}: {key} = {_show(value)}: expected 0 or more")
                continue
        values[key] = tuple(value) if kind in ("ints", "strs") else value
    missing = [key for key in IDENTITY_FIELDS if key not in table]
    if missing:
        problems.append(f"{label}: missing {', '.join(missing)} (every GPU needs "
                        f"{', '.join(IDENTITY_FIELDS)})")
    if len(problems) > before:
        return None, False
    lost = bool(values.pop("lost", False))
    return GpuReading(**values), lost


def _is_kind(value: Any, kind: str) -> bool:
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if not isinstance(value, list):
        return False
    if kind == "ints":
        return all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    return all(isinstance(v, str) for v in value)


def _show(value: Any) -> str:
    if isinstance(value, str | int | float | bool):
        return json.dumps(value)
    if isinstance(value, list):
        return "an array"
    return "a table" if isinstance(value, dict) else type(value).__name__


def _error(path: str, problems: list[str]) -> ProbeError:
    return ProbeError(f"fake GPU inventory {path}: " + "; ".join(problems)
                      + " (the format is described in wrapper/gpu/fake.py; "
                      "`jobwrap check gpu --dump-inventory PATH` writes a valid one)")


def dump_inventory(driver_version: str, cuda_driver_version: str,
                   readings: Iterable[GpuReading], *, comment: str = "") -> str:
    """Readings as an inventory that :func:`parse_inventory` reads back unchanged."""
    out = []
    if comment:
        out.append("# " + " ".join(comment.split()))
    out += [f"format = {FORMAT}", f"driver_version = {_toml(driver_version)}",
            f"cuda_driver_version = {_toml(cuda_driver_version)}"]
    for reading in readings:
        out.append("\n[[gpu]]")
        for key in (*IDENTITY_FIELDS, *HEALTH_FIELDS):
            value = getattr(reading, key)
            if value is not None:
                out.append(f"{key} = {_toml(value)}")
    return "\n".join(out) + "\n"


def _toml(value: object) -> str:
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    # A JSON string is a TOML basic string once non-BMP characters stay literal (JSON
    # would write surrogate pairs) and DEL is escaped (TOML forbids it raw).
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")


class FakeProbe:
    """Answers from an inventory as NVML would: only the fields asked for, same errors."""

    name = "fake"

    def __init__(self, inventory: Inventory, path: str, *, kmsg_path: str = "",
                 xid_window: float = 3600.0) -> None:
        self.inventory = inventory
        self.path = path
        # The GPUs are fake, the kernel log is not: with ``[gpu] xid_source = "kmsg"`` the
        # Xids the kernel logged for a GPU's PCI address are added to the inventory's, as
        # the nvml probe reads them, so the same parser is on the path in the sandbox.
        self.kmsg_path = kmsg_path
        self.xid_window = xid_window

    @classmethod
    def from_config(cls, config: GpuConfig, node: str) -> FakeProbe:
        if not config.fake_inventory:
            raise ProbeError('[gpu] backend = "fake" needs [gpu] fake_inventory = "PATH" '
                             "(a TOML inventory; {node} in it is the Slurm node name)")
        path = inventory_path(config.fake_inventory, node)
        return cls(load_inventory(path), path,
                   kmsg_path=config.kmsg_path if config.xid_source == "kmsg" else "",
                   xid_window=config.xid_window)

    def _driver(self) -> None:
        if not self.inventory.driver_loaded:
            raise ProbeError(f"the NVIDIA driver is not loaded (fake inventory {self.path}: "
                             "driver_loaded = false)", kind="no-driver")

    def driver_version(self) -> str:
        self._driver()
        return self.inventory.driver_version

    def cuda_driver_version(self) -> str:
        self._driver()
        return self.inventory.cuda_driver_version

    def devices(self, fields: Collection[str]) -> list[GpuReading]:
        self._driver()
        for reading in self.inventory.gpus:
            if reading.index in self.inventory.lost:
                raise ProbeError(f"gpu{reading.index}: GPU {reading.pci_bus_id} is lost "
                                 f"(fake inventory {self.path}: lost = true)",
                                 kind="gpu", gpu_index=reading.index)
        readings = list(self.inventory.gpus)
        if "xid_events" in fields and self.kmsg_path:
            readings = self._with_kernel_xids(readings)
        return [reading.only(fields) for reading in readings]

    def _with_kernel_xids(self, readings: list[GpuReading]) -> list[GpuReading]:
        import dataclasses

        from wrapper.gpu import kmsg

        logged = kmsg.kernel_xids(self.kmsg_path, self.xid_window)
        if logged is None:
            return readings  # not root: as the nvml probe, the inventory's alone
        out = []
        for reading in readings:
            extra = logged.get(kmsg.device_key(reading.pci_bus_id), []) \
                if reading.pci_bus_id else []
            codes = tuple(reading.xid_events or ()) + tuple(
                c for c in extra if c not in (reading.xid_events or ()))
            out.append(dataclasses.replace(reading, xid_events=codes) if extra else reading)
        return out

    def close(self) -> None:
        """Nothing to release."""
