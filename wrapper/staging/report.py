"""Records of staging: how far a stage is (Progress) and what it did (StageItem, StageReport).

They cross the boundary between the user-side worker and the hook, so each can be turned
into plain JSON and back; ``from_wire`` checks every field, because what the worker
sends is never trusted more than the user it runs as.
"""

from __future__ import annotations

from dataclasses import asdict, field
from typing import Any

from wrapper.lean import dataclass
from wrapper.staging.errors import StagingError


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

    @classmethod
    def from_wire(cls, data: Any) -> Progress:
        fields = _dict(data, "progress")
        return cls(directive=_get(fields, "directive", str),
                   files_done=_get(fields, "files_done", int),
                   files_total=_get(fields, "files_total", int),
                   bytes_done=_get(fields, "bytes_done", int),
                   bytes_total=_get(fields, "bytes_total", int),
                   seconds=float(_get(fields, "seconds", (int, float))),
                   done=_get(fields, "done", bool))


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

    @classmethod
    def from_wire(cls, data: Any) -> StageItem:
        fields = _dict(data, "item")
        hit = fields.get("cache_hit")
        if hit is not None and not isinstance(hit, bool):
            raise StagingError("the staging worker sent a bad item: cache_hit")
        problems = _get(fields, "problems", list)
        checksums = _get(fields, "checksums", dict)
        if not all(isinstance(p, str) for p in problems) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in checksums.items()):
            raise StagingError("the staging worker sent a bad item: problems or checksums")
        return cls(direction=_get(fields, "direction", str),
                   directive=_get(fields, "directive", str),
                   source=_get(fields, "source", str), dest=_get(fields, "dest", str),
                   files=_get(fields, "files", int), bytes=_get(fields, "bytes", int),
                   seconds=float(_get(fields, "seconds", (int, float))), cache_hit=hit,
                   cache_wait=float(_get(fields, "cache_wait", (int, float))),
                   unpacked=_get(fields, "unpacked", bool),
                   missing=_get(fields, "missing", bool), problems=tuple(problems),
                   checksums=dict(checksums))  # cache_key: root's alone, never the worker's


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


def _dict(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise StagingError(f"the staging worker sent a bad {what}")
    return data


def _get(data: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = data.get(key)
    # bool is an int to isinstance; a count must not be True
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise StagingError(f"the staging worker sent a bad value for {key!r}")
    return value
