"""Which pids use a GPU of this node: the guard's one seam to the GPU probe.

The guard only needs a callable that returns those pids (:class:`GpuPidSource`).
:func:`gpu_pid_source` chooses it: the health checks' own probe (``wrapper.gpu``), or a
small TOML file of pids (tests, dry runs).
"""

from __future__ import annotations

import tomllib
from dataclasses import field
from pathlib import Path
from typing import Protocol

from wrapper.config import Config
from wrapper.errors import JobwrapError
from wrapper.fastdataclass import dataclass


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
class ProbeGpuPids:
    """Compute processes from the health checks' own GPU probe (``[gpu] backend``: nvml,
    or fake with ``fake_inventory``); a login node without an NVIDIA driver has none."""

    config: Config
    node: str
    _absent: bool = field(default=False, repr=False)

    def __call__(self) -> set[int]:
        if self._absent:
            return set()
        from wrapper.gpu.backend import open_probe
        from wrapper.gpu.probe import ProbeError

        try:
            probe = open_probe(self.config.gpu, self.node)
            try:
                readings = probe.devices({"compute_pids"})
            finally:
                probe.close()
        except ProbeError as exc:
            if exc.kind == "no-driver":
                self._absent = True  # no driver, so no GPU anyone could use here
                return set()
            raise GpuProbeError(f"the GPU probe cannot list GPU processes: {exc}") from None
        return {pid for reading in readings for pid in (reading.compute_pids or ())}


def gpu_pid_source(config: Config) -> GpuPidSource:
    """Which GPU probe the guard asks: ``[login_guard] gpu_pids_file`` when set (a bare
    list of pids, for tests and dry runs), else the same probe as the health checks."""
    if config.login_guard.gpu_pids_file:
        return TomlGpuPids(Path(config.login_guard.gpu_pids_file))
    import socket

    return ProbeGpuPids(config, socket.gethostname().split(".")[0])
