"""The NVML probe where it really runs here: a machine without an NVIDIA driver."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pynvml
import pytest

from wrapper.config import Config, GpuConfig
from wrapper.gpu.nvml import NvmlProbe, translate
from wrapper.gpu.probe import ALL_FIELDS, ProbeError
from wrapper.gpu.report import run_checks


def test_no_driver_here_is_a_clear_probe_error() -> None:
    probe = NvmlProbe(GpuConfig())
    for call in (probe.driver_version, probe.cuda_driver_version,
                 lambda: probe.devices(ALL_FIELDS)):
        with pytest.raises(ProbeError) as info:
            call()
        message = str(info.value)
        assert info.value.kind == "no-driver"
        assert message.startswith("NVML: cannot initialise NVML: libnvidia-ml.so.1 was not "
                                  "found: the NVIDIA driver is not installed on this node")
        assert "\n" not in message
    probe.close()


@pytest.mark.parametrize(("gres", "status"), [(4, "fail"), (0, "pass")])
def test_no_driver_is_a_node_fault_only_where_slurm_lists_gpus(gres: int, status: str) -> None:
    probe = NvmlProbe(GpuConfig())
    report = run_checks(Config(), probe, phase="prolog", allocated=[0], configured_gres=gres,
                        env={})
    [row] = report.results
    assert (row.check, row.status) == ("probe", status)
    if status == "fail":
        assert "Slurm's gres lists 4 GPUs" in row.reason
        assert report.drain_reason().startswith("jobwrap: probe: NVML: cannot initialise")


def test_no_driver_and_no_gres_known_is_jobwraps_problem() -> None:
    with pytest.raises(ProbeError) as info:
        run_checks(Config(), NvmlProbe(GpuConfig()), phase="check", allocated=None,
                   configured_gres=None, env={})
    assert info.value.exit_code == 2


@pytest.mark.parametrize(("code", "kind", "words"), [
    (pynvml.NVML_ERROR_GPU_IS_LOST, "gpu", "fallen off the bus"),
    (pynvml.NVML_ERROR_RESET_REQUIRED, "gpu", "needs a reset"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "no-driver", "kernel driver is not loaded"),
    (pynvml.NVML_ERROR_NO_PERMISSION, "broken", "run as root"),
    (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "node", "without a reboot"),
    (pynvml.NVML_ERROR_INVALID_ARGUMENT, "broken", "Invalid Argument"),
])
def test_nvml_errors_say_whose_fault_and_what_to_do(code: int, kind: str, words: str) -> None:
    error = translate(pynvml, pynvml.NVMLError(code), "open the GPU", 3)
    assert error.kind == kind
    assert words in str(error)
    assert str(error).startswith("NVML: gpu3: cannot open the GPU: ")
    assert error.gpu_index == (3 if kind == "gpu" else None)
    assert error.exit_code == (1 if kind in ("gpu", "node") else 2)


def test_a_lost_gpu_fails_its_check_with_its_index() -> None:
    # What run_checks does with the error NVML raises for a GPU that fell off the bus.
    from wrapper.gpu.report import _probe_failure

    row = _probe_failure(translate(pynvml, pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST),
                                   "open the GPU", 2), 8)
    assert (row.check, row.status, row.gpu_index) == ("probe", "fail", 2)
    assert row.reason.startswith("NVML: cannot open the GPU: the GPU is lost")


def test_without_pynvml_the_message_says_what_to_install(tmp_path: Path) -> None:
    # Python's own way to make an import fail: a None entry in sys.modules.
    script = textwrap.dedent("""
        import sys
        sys.modules["pynvml"] = None
        from wrapper.config import GpuConfig
        from wrapper.gpu.nvml import NvmlProbe
        from wrapper.gpu.probe import ProbeError
        try:
            NvmlProbe(GpuConfig()).driver_version()
        except ProbeError as exc:
            print(exc.kind, exc)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith("broken cannot import pynvml: install nvidia-ml-py")


def test_importing_the_gpu_package_loads_no_gpu_library() -> None:
    script = ("import sys, wrapper.gpu, wrapper.gpu.fake\n"
              "print(sorted(m for m in ('pynvml', 'psutil', 'ctypes') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


class _FakeNvmlEvents:
    """NVML's event API as pynvml exposes it, for two GPUs: the second delivers no Xid
    events (an older board), so its Xids must come from the kernel log."""

    NVMLError = pynvml.NVMLError
    NVML_ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

    class _Pci:
        def __init__(self, bus: str) -> None:
            self.busId = bus.encode()

    class _Event:
        def __init__(self, device: int, kind: int, data: int) -> None:
            self.device, self.eventType, self.eventData = device, kind, data

    def __init__(self) -> None:
        self.queue: list[_FakeNvmlEvents._Event] = []
        self.freed = self.shutdowns = 0
        self.lost = False

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return 1000 + index

    def nvmlDeviceGetPciInfo(self, handle: int) -> _FakeNvmlEvents._Pci:
        return self._Pci({1000: "00000000:3B:00.0", 1001: "00000000:5D:00.0"}[handle])

    def nvmlDeviceRegisterEvents(self, handle: int, kinds: int, event_set: str) -> None:
        if handle == 1001:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> _FakeNvmlEvents._Event:
        if self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if not self.queue:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return self.queue.pop(0)

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.freed += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1


def test_the_xid_event_api_is_the_source_where_a_gpu_delivers_it(tmp_path: Path) -> None:
    from wrapper.gpu.nvml import XidListener, node_xids

    nv = _FakeNvmlEvents()
    listener = XidListener.open(nv)
    assert listener is not None and listener.covers("0000:3b:00")
    assert not listener.covers("0000:5d:00")
    nv.queue = [nv._Event(1000, pynvml.nvmlEventTypeXidCriticalError, 79),
                nv._Event(1000, 0x1, 5),  # another event type: not an Xid
                nv._Event(1000, pynvml.nvmlEventTypeXidCriticalError, 79),
                nv._Event(1000, pynvml.nvmlEventTypeXidCriticalError, 48)]
    # the kernel log names both GPUs; only the one without events is taken from it
    log = tmp_path / "kmsg"
    log.write_text("4,1,5000000,-;NVRM: Xid (PCI:0000:3b:00): 13, from the log\n"
                   "4,2,5000000,-;NVRM: Xid (PCI:0000:5d:00): 63, from the log\n")
    found = node_xids(str(log), 1e9, listener)
    assert found == {"0000:3b:00": [79, 48], "0000:5d:00": [63]}
    assert node_xids(str(log), 1e9, listener)["0000:3b:00"] == [79, 48]  # kept
    assert node_xids(str(tmp_path / "none"), 1e9) is None
    nv.lost = True
    with pytest.raises(ProbeError) as info:
        listener.poll()
    assert info.value.kind == "gpu"
    listener.close()
    assert nv.freed == 1 and nv.shutdowns == 1


def test_no_listener_where_no_gpu_delivers_xid_events() -> None:
    from wrapper.gpu.nvml import XidListener, open_xid_listener

    nv = _FakeNvmlEvents()
    nv.nvmlDeviceGetCount = lambda: 1  # type: ignore[method-assign]
    nv.nvmlDeviceGetHandleByIndex = lambda index: 1001  # type: ignore[method-assign]
    assert XidListener.open(nv) is None and nv.freed == 1
    assert open_xid_listener(GpuConfig()) is None  # no driver on this machine
    assert open_xid_listener(GpuConfig(backend="fake", fake_inventory="x")) is None
