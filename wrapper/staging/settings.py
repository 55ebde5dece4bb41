"""How staging is tuned (from ``[staging]`` in the config), in one record."""

from __future__ import annotations

from typing import TYPE_CHECKING

from wrapper.fastdataclass import dataclass
from wrapper.staging.copy import VERIFY_CHOICES

if TYPE_CHECKING:
    from wrapper.config import StagingConfig

GIB = 1 << 30


@dataclass(frozen=True)
class StageSettings:
    verify: str = "size"  # "size", or "sha256": size and checksum of every staged file
    parallel: int = 8  # files copied at once
    free_margin_bytes: int = GIB  # local disk space a stage-in must leave free
    zstd_command: str = "zstd"
    progress_interval: float = 1.0  # seconds between two progress reports

    def __post_init__(self) -> None:
        if self.verify not in VERIFY_CHOICES:
            raise ValueError(f"verify must be one of {VERIFY_CHOICES}, not {self.verify!r}")
        if self.parallel < 1:
            raise ValueError("parallel must be at least 1")

    @classmethod
    def from_config(cls, cfg: StagingConfig) -> StageSettings:
        return cls(verify=cfg.verify, parallel=cfg.parallel_files,
                   free_margin_bytes=int(cfg.free_space_margin_gib * GIB),
                   zstd_command=cfg.zstd_command)
