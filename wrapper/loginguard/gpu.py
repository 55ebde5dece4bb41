"""Which pids use a GPU of this node: the guard's one seam to the GPU probe.

The guard only needs a callable that returns those pids (:class:`GpuPidSource`).
:func:`gpu_pid_source` is where it is chosen, and the one place to change when the
login guard reads the same probe as the health checks (``wrapper.gpu``): until then it
reads a small TOML file (tests, dry runs) or asks NVML directly.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from wrapper.config import Config
from wrapper.errors import JobwrapError


class GpuProbeError(JobwrapError):
    """The GPU probe gave no answer this time; the GPU rule is skipped, not failed."""


class GpuPidSource(Protocol):
    def __call__(self) -> set[int]:
        """The pids of the compute processes on this node's GPUs."""
        ...


@dataclass(frozen=True)
class TomlGpuPids:
    """Reads ``[[gpu]] processes = [PID, ...]`` afresh on every call, so tests can edit it."""

    path: Path

    def __call__(self) -> set[int]:
        try:
            data = tomllib.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise GpuProbeError(f"cannot read the GPU pid file {self.path}: {exc}") from None
        pids: set[int] = set()
        gpus = data.get("gpu", [])
        if not isinstance(gpus, list):
            raise GpuProbeError(f"{self.path}: expected [[gpu]] tables")
        for gpu in gpus:
            procs = gpu.get("processes", []) if isinstance(gpu, dict) else None
            if not isinstance(procs, list) or not all(
                    isinstance(p, int) and not isinstance(p, bool) for p in procs):
                raise GpuProbeError(f"{self.path}: each [[gpu]] needs processes = [PID, ...]")
            pids.update(procs)
        return pids


@dataclass
class NvmlGpuPids:
    """Compute processes from NVML; a login node without an NVIDIA driver has none."""

    _nvml: Any = field(default=None, repr=False)
    _absent: bool = field(default=False, repr=False)

    def __call__(self) -> set[int]:
        if self._absent:
            return set()
        if self._nvml is None:
            import pynvml

            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError_LibraryNotFound:
                self._absent = True  # no driver, so no GPU anyone could use here
                return set()
            except pynvml.NVMLError_DriverNotLoaded:
                self._absent = True
                return set()
            except pynvml.NVMLError as exc:
                raise GpuProbeError(f"NVML cannot start: {exc}") from None
            self._nvml = pynvml
        nvml = self._nvml
        pids: set[int] = set()
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    pids.add(int(proc.pid))
        except nvml.NVMLError as exc:
            raise GpuProbeError(f"NVML cannot list GPU processes: {exc}") from None
        return pids


def gpu_pid_source(config: Config) -> GpuPidSource:
    """The integration point: which GPU probe the guard asks.

    ``[login_guard] gpu_pids_file`` wins (tests and dry runs); otherwise NVML. When
    ``wrapper.gpu`` lands, return a source built on its probe here (its readings carry
    the compute pids, and its ``fake`` backend serves ``[gpu] fake_inventory``).
    """
    if config.login_guard.gpu_pids_file:
        return TomlGpuPids(Path(config.login_guard.gpu_pids_file))
    return NvmlGpuPids()
