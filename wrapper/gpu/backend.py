"""Which probe a node reads its GPUs with: ``[gpu] backend`` picks ``nvml`` or ``fake``.

Above the seam (:mod:`wrapper.gpu.probe`) and both probes that implement it: the probes
import the seam, and only this module knows them both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wrapper.config import GpuConfig
    from wrapper.gpu.nvml import XidListener
    from wrapper.gpu.probe import Probe


def open_probe(config: GpuConfig, node: str, *, listener: XidListener | None = None) -> Probe:
    """The probe ``[gpu] backend`` asks for. ``node`` is the Slurm node name: the fake
    probe expands ``{node}`` in its inventory path with it.

    The nvml probe loads pynvml and initialises NVML only when first asked something, so
    that its errors come from the calls the checks make; the fake probe reads and
    validates its inventory here. ``listener`` (the node watcher's, on NVML's Xid events)
    is where the nvml probe takes its GPUs' Xids from.
    """
    if config.backend == "fake":
        from wrapper.gpu.fake import FakeProbe

        return FakeProbe.from_config(config, node)
    from wrapper.gpu.nvml import NvmlProbe

    return NvmlProbe(config, listener)
