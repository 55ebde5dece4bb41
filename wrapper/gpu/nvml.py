"""The production probe: NVML through pynvml (nvidia-ml-py), loaded and initialised on first use.

pynvml is imported inside the probe, never at module level, so that code paths which do
not read GPUs (and the fake probe) do not pay for it. Every NVML error becomes a
:class:`ProbeError` whose ``kind`` says whose fault it is: a GPU that is lost or needs a
reset is the node's; a missing library, a missing driver or a permission problem is not
a GPU fault (see :mod:`wrapper.gpu.probe`). Fields a GPU does not support (NVML answers
"Not Supported", or the driver predates the function) are read as None.

Xid events: a probe that lives for a prolog's second reads them from the kernel log (NVML's
event API delivers only what happens while a process waits for it: see
:mod:`wrapper.gpu.kmsg`); the node watcher, which lives as long as the job, opens an
:class:`XidListener` on NVML's event API at its start and hands it to each probe it opens:
its GPUs' Xids then come from the driver's events, the kernel log only for a GPU that
does not deliver them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from wrapper.errors import JobwrapError
from wrapper.gpu.kmsg import device_key, kernel_xids
from wrapper.gpu.probe import GpuReading, ProbeError, ProbeErrorKind, normalise_pci_bus_id

if TYPE_CHECKING:
    from wrapper.config import GpuConfig

# NVML's clock event ("throttle") reason bits -> jobwrap's names (probe.THROTTLE_REASONS).
_THROTTLE_BITS = {
    0x001: "gpu_idle", 0x002: "applications_clocks_setting", 0x004: "sw_power_cap",
    0x008: "hw_slowdown", 0x010: "sync_boost", 0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown", 0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

# NVML error codes (pynvml's NVML_ERROR_*) -> whose fault, and what to do about it.
_ERRORS: dict[str, tuple[ProbeErrorKind, str]] = {
    "LIBRARY_NOT_FOUND": ("no-driver", "libnvidia-ml.so.1 was not found: the NVIDIA driver "
                          "is not installed on this node"),
    "DRIVER_NOT_LOADED": ("no-driver", "the NVIDIA kernel driver is not loaded "
                          "(`lsmod | grep nvidia`; load it or reboot)"),
    "NO_PERMISSION": ("broken", "no permission to query the GPUs; run as root (the hooks do) "
                      "or check the permissions of /dev/nvidia*"),
    "LIB_RM_VERSION_MISMATCH": ("node", "the NVML library and the loaded kernel driver are of "
                                "different versions (driver upgraded without a reboot?)"),
    "GPU_IS_LOST": ("gpu", "the GPU is lost (fallen off the bus); reset it or reboot the node"),
    "RESET_REQUIRED": ("gpu", "the GPU needs a reset (`nvidia-smi -r -i N`) or a reboot"),
    "CORRUPTED_INFOROM": ("gpu", "the GPU's infoROM is corrupted; contact NVIDIA support"),
    "INSUFFICIENT_POWER": ("gpu", "the GPU's external power cables are not connected "
                           "properly"),
    "IRQ_ISSUE": ("node", "NVIDIA's driver cannot get interrupts from the GPU"),
    "TIMEOUT": ("gpu", "the GPU did not answer in time"),
    "GPU_NOT_FOUND": ("gpu", "the GPU was not found"),
}
# Answers that mean "this GPU or this driver has no such field".
_ABSENT = ("NOT_SUPPORTED", "FUNCTION_NOT_FOUND", "NO_DATA")


def translate(nv: Any, exc: Exception, what: str, gpu_index: int | None = None) -> ProbeError:
    """One NVML error -> a one-line ProbeError naming the GPU, the call and what to do."""
    code = getattr(exc, "value", None)
    try:
        text = str(exc)
    except Exception:  # NVMLError.__str__ asks the library, which may be what failed
        text = f"NVML error {code}"
    where = f"gpu{gpu_index}: " if gpu_index is not None else ""
    for name, (kind, hint) in _ERRORS.items():
        if code is not None and code == getattr(nv, f"NVML_ERROR_{name}", None):
            return ProbeError(f"NVML: {where}cannot {what}: {hint} ({text})", kind=kind,
                              gpu_index=gpu_index if kind == "gpu" else None)
    return ProbeError(f"NVML: {where}cannot {what}: {text}", kind="broken")


def _is(nv: Any, exc: Exception, names: Collection[str]) -> bool:
    code = getattr(exc, "value", None)
    return any(code == getattr(nv, f"NVML_ERROR_{name}", object()) for name in names)


class NvmlProbe:
    """Reads the node's GPUs through NVML; initialises once, shuts down in :meth:`close`."""

    name = "nvml"

    def __init__(self, config: GpuConfig, listener: XidListener | None = None) -> None:
        self.config = config
        self.listener = listener
        self._nv: Any = None
        self._busy = 0  # reads in progress (one may outlive its budget in another thread)

    # -- NVML's life -------------------------------------------------------------------
    def _lib(self) -> Any:
        if self._nv is not None:
            return self._nv
        try:
            import pynvml
        except ImportError:
            raise ProbeError("cannot import pynvml: install nvidia-ml-py (a dependency of "
                             "jobwrap) in jobwrap's environment, or set [gpu] backend = "
                             '"fake"') from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise translate(pynvml, exc, "initialise NVML") from None
        self._nv = pynvml
        return pynvml

    def close(self) -> None:
        nv, self._nv = self._nv, None
        if nv is None or self._busy:
            # Shutting NVML down under a read that is still inside it (it ran past its
            # budget) could crash the process; it is about to end anyway.
            return
        # A failed shutdown leaves nothing to undo: the process ends right after.
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()

    def _call(self, fn: Callable[..., Any], what: str, *args: Any,
              gpu: int | None = None) -> Any:
        nv = self._nv
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            raise translate(nv, exc, what, gpu) from None

    def _optional(self, fns: list[Callable[..., Any]], what: str, gpu: int,
                  *args: Any) -> Any:
        """The first of ``fns`` the driver has; None when the GPU does not support it."""
        nv = self._nv
        # Raised by pynvml's unversioned wrappers when the driver lacks the versioned
        # function they call; older pynvml releases do not have it.
        mismatch = getattr(nv, "NVMLLibraryMismatchError", ())
        for fn in fns:
            try:
                return fn(*args)
            except mismatch:
                continue  # pynvml wants a newer versioned function than the driver has
            except nv.NVMLError as exc:
                if _is(nv, exc, ("FUNCTION_NOT_FOUND", "ARGUMENT_VERSION_MISMATCH")):
                    continue
                if _is(nv, exc, _ABSENT):
                    return None
                raise translate(nv, exc, what, gpu) from None
        return None

    # -- the probe interface -----------------------------------------------------------
    def driver_version(self) -> str:
        nv = self._lib()
        return str(self._call(nv.nvmlSystemGetDriverVersion, "read the driver version"))

    def cuda_driver_version(self) -> str:
        nv = self._lib()
        fns = [getattr(nv, "nvmlSystemGetCudaDriverVersion_v2", None),
               nv.nvmlSystemGetCudaDriverVersion]
        for fn in fns:
            if fn is None:
                continue
            try:
                value = int(fn())
            except nv.NVMLError as exc:
                if _is(nv, exc, ("FUNCTION_NOT_FOUND",)):
                    continue
                raise translate(nv, exc, "read the CUDA driver version") from None
            # NVML encodes 12.4 as 12040.
            return f"{value // 1000}.{value % 1000 // 10}"
        raise ProbeError("NVML: cannot read the CUDA driver version: the driver has no "
                         "nvmlSystemGetCudaDriverVersion")

    def devices(self, fields: Collection[str]) -> list[GpuReading]:
        nv = self._lib()
        wanted = frozenset(fields)
        self._busy += 1
        try:
            count = int(self._call(nv.nvmlDeviceGetCount, "count the GPUs"))
            xids = self._recent_xids() if "xid_events" in wanted else None
            return [self._read(nv, index, wanted, xids) for index in range(count)]
        finally:
            self._busy -= 1

    def _recent_xids(self) -> dict[str, list[int]] | None:
        if self.config.xid_source != "kmsg":
            return None
        return node_xids(self.config.kmsg_path, self.config.xid_window, self.listener)

    def _read(self, nv: Any, index: int, wanted: frozenset[str],
              xids: dict[str, list[int]] | None) -> GpuReading:
        handle = self._call(nv.nvmlDeviceGetHandleByIndex, "open the GPU", index, gpu=index)

        def need(what: str, fn: Callable[..., Any], *args: Any) -> Any:
            return self._call(fn, what, handle, *args, gpu=index)

        def opt(what: str, *fns: Callable[..., Any], args: tuple[Any, ...] = ()) -> Any:
            return self._optional(list(fns), what, index, handle, *args)

        bus_id = need("read the PCI bus id", nv.nvmlDeviceGetPciInfo).busId
        if isinstance(bus_id, bytes):
            bus_id = bus_id.decode("ascii", "replace")
        pci = normalise_pci_bus_id(bus_id)
        values: dict[str, Any] = {
            "index": index,
            "minor": int(need("read the minor number", nv.nvmlDeviceGetMinorNumber)),
            "uuid": str(need("read the UUID", nv.nvmlDeviceGetUUID)),
            "name": str(need("read the name", nv.nvmlDeviceGetName)),
            "pci_bus_id": pci,
        }
        if "serial" in wanted:
            serial = opt("read the serial number", nv.nvmlDeviceGetSerial)
            values["serial"] = None if serial is None else str(serial)
        unc = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        if "ecc_volatile_uncorrected" in wanted:
            values["ecc_volatile_uncorrected"] = opt(
                "read ECC counters", nv.nvmlDeviceGetTotalEccErrors,
                args=(unc, nv.NVML_VOLATILE_ECC))
        if "ecc_aggregate_uncorrected" in wanted:
            values["ecc_aggregate_uncorrected"] = opt(
                "read ECC counters", nv.nvmlDeviceGetTotalEccErrors,
                args=(unc, nv.NVML_AGGREGATE_ECC))
        if "retired_pages_pending" in wanted:
            pending = opt("read retired pages", nv.nvmlDeviceGetRetiredPagesPendingStatus)
            values["retired_pages_pending"] = None if pending is None else bool(pending)
        for field, cause in (("retired_pages_dbe",
                              nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
                             ("retired_pages_sbe",
                              nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)):
            if field in wanted:
                pages = opt("read retired pages", nv.nvmlDeviceGetRetiredPages, args=(cause,))
                values[field] = None if pages is None else len(pages)
        if {"row_remap_pending", "row_remap_failed"} & wanted:
            rows = opt("read row remapping", nv.nvmlDeviceGetRemappedRows)
            if rows is not None:
                _corrected, _uncorrected, pending, failed = rows
                values["row_remap_pending"] = bool(pending)
                values["row_remap_failed"] = bool(failed)
        if "xid_events" in wanted and xids is not None:
            values["xid_events"] = tuple(xids.get(device_key(pci), ()))
        if "temperature" in wanted:
            values["temperature"] = opt(
                "read the temperature", *_present(nv, "nvmlDeviceGetTemperatureV",
                                                  "nvmlDeviceGetTemperature"),
                args=(nv.NVML_TEMPERATURE_GPU,))
        for field, threshold in (("temperature_slowdown",
                                  nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
                                 ("temperature_shutdown",
                                  nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)):
            if field in wanted:
                values[field] = opt("read temperature thresholds",
                                    nv.nvmlDeviceGetTemperatureThreshold, args=(threshold,))
        if "throttle_reasons" in wanted:
            mask = opt("read clock event reasons",
                       *_present(nv, "nvmlDeviceGetCurrentClocksEventReasons",
                                 "nvmlDeviceGetCurrentClocksThrottleReasons"))
            values["throttle_reasons"] = None if mask is None else tuple(
                name for bit, name in _THROTTLE_BITS.items() if int(mask) & bit)
        for field, fn_name in (("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
                               ("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
                               ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth"),
                               ("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth")):
            if field in wanted:
                values[field] = opt("read the PCIe link", *_present(nv, fn_name))
        if {"nvlink_links", "nvlink_links_down"} & wanted:
            links, down = self._nvlinks(nv, handle, index)
            values["nvlink_links"] = links
            values["nvlink_links_down"] = down
        if "persistence_mode" in wanted:
            mode = opt("read the persistence mode", nv.nvmlDeviceGetPersistenceMode)
            values["persistence_mode"] = None if mode is None \
                else mode == nv.NVML_FEATURE_ENABLED
        if "memory_used_mib" in wanted:
            values["memory_used_mib"] = self._memory_used(nv, handle, index)
        if "compute_pids" in wanted:
            procs = opt("list compute processes",
                        *_present(nv, "nvmlDeviceGetComputeRunningProcesses",
                                  "nvmlDeviceGetComputeRunningProcesses_v2"))
            values["compute_pids"] = None if procs is None else tuple(
                sorted(int(p.pid) for p in procs))
        if "utilization_pct" in wanted:
            rates = opt("read the utilisation", nv.nvmlDeviceGetUtilizationRates)
            values["utilization_pct"] = None if rates is None else int(rates.gpu)
        return GpuReading(**values)

    def _nvlinks(self, nv: Any, handle: Any,
                 index: int) -> tuple[int | None, tuple[int, ...] | None]:
        present: list[int] = []
        down: list[int] = []
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                state = nv.nvmlDeviceGetNvLinkState(handle, link)
            except nv.NVMLError as exc:
                if _is(nv, exc, (*_ABSENT, "INVALID_ARGUMENT")):
                    if link == 0:
                        break  # no link 0: a GPU without NVLink
                    continue  # links need not be numbered without gaps
                raise translate(nv, exc, "read NVLink state", index) from None
            present.append(link)
            if state != nv.NVML_FEATURE_ENABLED:
                down.append(link)
        if not present:
            return None, None
        return len(present), tuple(down)

    def _memory_used(self, nv: Any, handle: Any, index: int) -> int | None:
        # Version 2 leaves out the memory the driver reserves for itself, which version
        # 1 counts as used (hundreds of MiB on an idle H100).
        version = getattr(nv, "nvmlMemory_v2", None)
        if version is not None:
            info = self._optional([lambda h: nv.nvmlDeviceGetMemoryInfo(h, version=version)],
                                  "read memory use", index, handle)
            if info is not None:
                return int(info.used) // (1024 * 1024)
        info = self._optional([nv.nvmlDeviceGetMemoryInfo], "read memory use", index, handle)
        return None if info is None else int(info.used) // (1024 * 1024)


def _present(nv: Any, *names: str) -> list[Callable[..., Any]]:
    """The functions of ``names`` this pynvml has, newest first."""
    return [fn for fn in (getattr(nv, name, None) for name in names) if fn is not None]


def open_xid_listener(config: GpuConfig) -> XidListener | None:
    """A listener on NVML's Xid events for a long-lived root process, or None where NVML,
    the driver or the GPUs cannot give one (the kernel log stays the source)."""
    if config.backend != "nvml" or config.xid_source == "none":
        return None
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()  # reference-counted: the listener keeps NVML up between probes
    except pynvml.NVMLError:
        return None
    listener = XidListener.open(pynvml)
    if listener is None:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    return listener


class XidListener:
    """Xids from NVML's own event API, for a long-lived root process (the node watcher).

    ``nvmlDeviceRegisterEvents`` with ``nvmlEventTypeXidCriticalError`` on every GPU that
    supports it, then ``nvmlEventSetWait_v2`` with no wait at each look: an event is the
    driver's own record of an Xid, with the device it happened on, and no text a user
    can shape reaches it (the kernel log, the fallback, carries file and process names;
    see :mod:`wrapper.gpu.kmsg`). NVML delivers only events that happen while the set is
    registered, so a watcher opens it at its start and keeps it; the Xids seen stay
    counted, by the GPU's PCI key, for as long as the watcher lives.
    """

    MAX_EVENTS = 1024  # read per look: a storm of events costs one look no more

    def __init__(self, nv: Any, event_set: Any, keys: dict[Any, str]) -> None:
        self.nv, self.event_set, self.keys = nv, event_set, keys
        self.seen: dict[str, list[int]] = {}

    @classmethod
    def open(cls, nv: Any) -> XidListener | None:
        """Register for the Xids of every GPU; None when NVML or the driver cannot (no
        GPU supports the event, an old driver): the caller keeps the kernel log."""
        try:
            event_set = nv.nvmlEventSetCreate()
        except (nv.NVMLError, AttributeError):
            return None
        keys: dict[Any, str] = {}
        try:
            for index in range(int(nv.nvmlDeviceGetCount())):
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                bus_id = nv.nvmlDeviceGetPciInfo(handle).busId
                if isinstance(bus_id, bytes):
                    bus_id = bus_id.decode("ascii", "replace")
                try:
                    nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError,
                                                event_set)
                except nv.NVMLError:
                    continue  # this GPU does not deliver Xid events: the kernel log does
                keys[_handle_key(handle)] = device_key(normalise_pci_bus_id(bus_id))
        except nv.NVMLError:
            keys = {}
        if not keys:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlEventSetFree(event_set)
            return None
        return cls(nv, event_set, keys)

    def covers(self, key: str) -> bool:
        """The GPU with this PCI key delivers its Xids here."""
        return key in self.keys.values()

    def poll(self) -> dict[str, list[int]]:
        """Every Xid delivered since the listener opened, by PCI key, each code once.
        Raises ProbeError when NVML fails (a lost GPU answers so too)."""
        nv = self.nv
        for _ in range(self.MAX_EVENTS):
            try:
                data = nv.nvmlEventSetWait_v2(self.event_set, 0)
            except nv.NVMLError as exc:
                if _is(nv, exc, ("TIMEOUT",)):
                    break  # nothing more waiting
                raise translate(nv, exc, "read Xid events") from None
            if int(data.eventType) != int(nv.nvmlEventTypeXidCriticalError):
                continue
            key = self.keys.get(_handle_key(data.device))
            if key is None:
                continue
            codes = self.seen.setdefault(key, [])
            if int(data.eventData) not in codes:
                codes.append(int(data.eventData))
        return {k: list(v) for k, v in self.seen.items()}

    def close(self) -> None:
        with contextlib.suppress(self.nv.NVMLError):
            self.nv.nvmlEventSetFree(self.event_set)
        with contextlib.suppress(self.nv.NVMLError):
            self.nv.nvmlShutdown()


def node_xids(kmsg_path: str, window: float,
              listener: XidListener | None = None) -> dict[str, list[int]] | None:
    """The Xids of the node's GPUs: the event API's for the GPUs a listener covers, the
    kernel log's for the others; None when neither can be read."""
    kernel = kernel_xids(kmsg_path, window)
    if listener is None:
        return kernel
    try:
        found = listener.poll()
    except JobwrapError as exc:
        # NVML's events failed (a lost GPU answers so): the kernel log this time, and
        # the probe's own reads say what is wrong with the GPU
        from wrapper import log

        log.get().warning("gpu.xid_events_unreadable", error=str(exc))
        return kernel
    for key, codes in (kernel or {}).items():
        if not listener.covers(key):
            found[key] = codes
    return found


def _handle_key(handle: Any) -> Any:
    """A device handle as a dict key: the address it points at (ctypes handles of one
    device compare by address, not identity)."""
    import ctypes

    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle
