"""Records of staging: how far a stage is (Progress) and what it did (StageItem, StageReport).

They cross the boundary between the user-side worker and the hook as plain JSON
(``as_dict``); root reads them back only through ``wrapper.staging.messages.decode``,
which checks every field, because what the worker sends is never trusted more than the
user it runs as.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, field
from typing import Any

from wrapper.fastdataclass import dataclass


def format_bytes(count: int | float) -> str:
    """1536 -> '1.5 KiB': sizes in messages a user reads."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Progress:
    """How far one directive has got; totals of 0 mean 'not known yet' (a tar stream)."""

    directive: str
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    seconds: float
    done: bool = False

    @property
    def rate(self) -> float:
        """Bytes per second so far."""
        return self.bytes_done / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rate": round(self.rate, 1)}


ProgressFn = Callable[[Progress], None]


@dataclass(frozen=True)
class StageItem:
    """What one directive did.

    ``cache_hit`` is None when the node cache was not used for it (stage-out, no cache,
    or a dataset larger than the cache); ``missing`` and ``problems`` are for stage-out,
    which copies whatever it can and says what it could not.
    """

    direction: str  # "in" or "out"
    directive: str
    source: str
    dest: str
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    cache_hit: bool | None = None
    cache_wait: float = 0.0  # seconds spent waiting for another job caching the same data
    unpacked: bool = False
    missing: bool = False
    problems: tuple[str, ...] = ()
    checksums: dict[str, str] = field(default_factory=dict)  # path -> sha256, verify=sha256
    cache_key: str = ""  # the node cache's key of the source tree (its digest), if cached

    @property
    def ok(self) -> bool:
        return not self.missing and not self.problems

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["problems"] = list(self.problems)
        return data


@dataclass(frozen=True)
class StageReport:
    """Every directive of one stage-in or stage-out, in the order given."""

    items: tuple[StageItem, ...] = ()

    @property
    def files(self) -> int:
        return sum(i.files for i in self.items)

    @property
    def bytes(self) -> int:
        return sum(i.bytes for i in self.items)

    @property
    def seconds(self) -> float:
        return sum(i.seconds for i in self.items)

    @property
    def ok(self) -> bool:
        return all(i.ok for i in self.items)

    @property
    def missing(self) -> list[str]:
        """Directives whose source did not exist (stage-out of a job that failed early)."""
        return [i.directive for i in self.items if i.missing]

    def as_dict(self) -> dict[str, Any]:
        return {"files": self.files, "bytes": self.bytes, "seconds": round(self.seconds, 3),
                "ok": self.ok, "items": [i.as_dict() for i in self.items]}
