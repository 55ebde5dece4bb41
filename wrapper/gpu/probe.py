"""The GPU probe seam: what one GPU reading holds, the interface every probe implements.

The checks read :class:`GpuReading` records and never know which probe produced them:
``nvml`` (the real GPUs, through pynvml) or ``fake`` (a TOML inventory), the one
``[gpu] backend`` names (``wrapper.gpu.backend.open_probe``). A probe reads
only the fields it is asked for, because on a node with eight GPUs every NVML call is
paid on the start path of every job.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection
from typing import Any, Literal, Protocol

from wrapper.errors import EXIT_BROKEN, EXIT_UNHEALTHY, JobwrapError
from wrapper.fastdataclass import dataclass

# What went wrong when a probe could not answer; it decides who is to blame:
#   broken     jobwrap or its config (pynvml missing, no permission, a bad inventory)
#   no-driver  no usable NVIDIA driver (a fault only where Slurm says the node has GPUs)
#   node       the node's GPU stack (e.g. the driver and NVML versions disagree)
#   gpu        one GPU (lost, needs a reset); ``gpu_index`` says which
#   timeout    the probe did not answer within its budget (treated as jobwrap's problem)
ProbeErrorKind = Literal["broken", "no-driver", "node", "gpu", "timeout"]


class ProbeError(JobwrapError):
    """A probe could not read the GPUs; ``kind`` says whose fault that is."""

    def __init__(self, message: str, *, kind: ProbeErrorKind = "broken",
                 gpu_index: int | None = None) -> None:
        super().__init__(message)
        self.kind: ProbeErrorKind = kind
        self.gpu_index = gpu_index
        self.exit_code = EXIT_UNHEALTHY if kind in ("node", "gpu") else EXIT_BROKEN


# Clock event ("throttle") reasons, by the names jobwrap uses (NVML's
# nvmlClocksEventReason* constants, in snake case).
THROTTLE_REASONS = (
    "gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
    "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
    "display_clock_setting",
)


@dataclass(frozen=True)
class GpuReading:
    """One GPU as a probe saw it. A health field is None when the GPU does not report it
    (or it was not asked for); the identity fields are always present."""

    index: int                      # NVML's index (nvidia-smi's numbering; PCI bus order)
    minor: int                      # N of /dev/nvidiaN: what gres.conf File= and Slurm use
    uuid: str                       # GPU-xxxxxxxx-...
    name: str                       # product name
    pci_bus_id: str                 # normalised: 0000:3b:00.0
    serial: str | None = None
    ecc_volatile_uncorrected: int | None = None   # since the driver loaded / last reset
    ecc_aggregate_uncorrected: int | None = None  # over the GPU's life
    retired_pages_pending: bool | None = None     # retirement waits for a reset
    retired_pages_dbe: int | None = None          # pages retired for double-bit errors
    retired_pages_sbe: int | None = None          # ... for repeated single-bit errors
    row_remap_pending: bool | None = None         # a remap waits for a reset (Ampere on)
    row_remap_failed: bool | None = None          # a remap failed: no spare rows left
    xid_events: tuple[int, ...] | None = None     # Xids seen recently on this GPU
    temperature: int | None = None                # degrees C
    temperature_slowdown: int | None = None       # the GPU slows itself down from here
    temperature_shutdown: int | None = None       # the GPU shuts itself down from here
    throttle_reasons: tuple[str, ...] | None = None  # active ones, see THROTTLE_REASONS
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None               # the most this GPU in this slot can do
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    nvlink_links: int | None = None               # NVLinks the GPU reports (None: no NVLink)
    nvlink_links_down: tuple[int, ...] | None = None
    persistence_mode: bool | None = None
    memory_used_mib: int | None = None            # excluding memory the driver reserves
    compute_pids: tuple[int, ...] | None = None   # compute processes on the GPU
    utilization_pct: int | None = None            # GPU busy over the last sample period

    def short_uuid(self) -> str:
        """The UUID's first 8 hex digits, enough to tell a node's GPUs apart: GPU-1a2b3c4d."""
        return self.uuid[:12]

    def only(self, fields: Collection[str]) -> GpuReading:
        """This reading with every health field not in ``fields`` set to None."""
        drop: dict[str, Any] = {name: None for name in HEALTH_FIELDS if name not in fields}
        return dataclasses.replace(self, **drop) if drop else self


IDENTITY_FIELDS = ("index", "minor", "uuid", "name", "pci_bus_id")
HEALTH_FIELDS = tuple(f.name for f in dataclasses.fields(GpuReading)
                      if f.name not in IDENTITY_FIELDS)
ALL_FIELDS = frozenset(HEALTH_FIELDS)


def field_kind(name: str) -> str:
    """A reading field's value kind: int, str, bool, ints (tuple of int) or strs."""
    annotation = str(_ANNOTATIONS[name])
    for prefix, kind in (("tuple[int", "ints"), ("tuple[str", "strs"), ("int", "int"),
                         ("bool", "bool"), ("str", "str")):
        if annotation.startswith(prefix):
            return kind
    raise AssertionError(f"GpuReading.{name} has an unsupported type {annotation}")


_ANNOTATIONS = {f.name: f.type for f in dataclasses.fields(GpuReading)}

_PCI = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})"
                  r"(?:\.([0-7]))?$")


def normalise_pci_bus_id(text: str) -> str:
    """``00000000:3B:00.0`` (NVML), ``0000:3b:00`` (kernel log) -> ``0000:3b:00.0``.

    Raises ValueError when ``text`` is not a PCI address.
    """
    match = _PCI.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a PCI bus id (like 0000:3b:00.0)")
    domain = int(match.group(1) or "0", 16)
    bus, device = int(match.group(2), 16), int(match.group(3), 16)
    function = int(match.group(4) or "0")
    width = 4 if domain <= 0xFFFF else 8
    return f"{domain:0{width}x}:{bus:02x}:{device:02x}.{function}"


class Probe(Protocol):
    """What the checks read. Every method may raise :class:`ProbeError`."""

    name: str

    def driver_version(self) -> str:
        """The NVIDIA driver's version, e.g. ``550.54.15``."""
        ...

    def cuda_driver_version(self) -> str:
        """The highest CUDA version the driver supports, e.g. ``12.4``."""
        ...

    def devices(self, fields: Collection[str]) -> list[GpuReading]:
        """Every GPU of the node, in index order, with only ``fields`` read."""
        ...

    def close(self) -> None:
        """Release the probe (NVML: shut down). Safe to call more than once."""
        ...
