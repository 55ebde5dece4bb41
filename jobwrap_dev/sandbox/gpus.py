"""Fake GPU inventories for the sandbox's nodes: healthy by default, faults on demand."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from wrapper.gpu.fake import dump_inventory
from wrapper.gpu.probe import GpuReading

DRIVER = "550.54.15"
CUDA = "12.4"


def healthy(node: str, count: int) -> list[GpuReading]:
    node_number = sum(map(ord, node)) % 256
    return [GpuReading(
        index=i, minor=i, uuid=f"GPU-{node_number:02x}{i:02x}a2b3-5d6e-7f80-91a2-b3c4d5e6f7{i:02x}",
        name="NVIDIA H100 80GB HBM3 (fake)", pci_bus_id=f"0000:{0x18 + 0x10 * i:02x}:00.0",
        serial=f"16523{node_number:03d}{i:05d}", ecc_volatile_uncorrected=0,
        ecc_aggregate_uncorrected=0, row_remap_pending=False, row_remap_failed=False,
        xid_events=(), temperature=35, temperature_slowdown=87, temperature_shutdown=92,
        throttle_reasons=("gpu_idle",), pcie_gen=5, pcie_gen_max=5, pcie_width=16,
        pcie_width_max=16, nvlink_links=18, nvlink_links_down=(), persistence_mode=True,
        memory_used_mib=0, compute_pids=()) for i in range(count)]


def write(path: Path, node: str, count: int, faults: dict[int, dict[str, Any]] | None = None,
          ) -> None:
    """Write ``node``'s inventory atomically; ``faults`` maps a minor to fields to change."""
    readings = [dataclasses.replace(r, **(faults or {}).get(r.minor, {}))
                for r in healthy(node, count)]
    text = dump_inventory(DRIVER, CUDA, readings,
                          comment=f"sandbox node {node}: fake GPUs, edit to inject faults")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    tmp.replace(path)
