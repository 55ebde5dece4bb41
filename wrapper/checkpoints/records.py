"""The records checkpoint discovery hands out: what was chosen, and what was passed over and why."""

from __future__ import annotations

from typing import Any

from wrapper.fastdataclass import dataclass


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint judged complete: the file or directory to resume from."""

    path: str  # absolute, as found in the directory (a symlink inside it keeps its own name)
    layout: str  # "lightning" | "hf" | "deepspeed" | "megatron" | "dcp" | "torch" | "generic"
    step: int | None  # training step or iteration, only when the layout's names say it
    mtime: float  # modification time of ``path`` (of its target, for a symlink)

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "layout": self.layout, "step": self.step,
                "mtime": self.mtime}


@dataclass(frozen=True)
class Skipped:
    """A candidate newer than the one chosen that was rejected, with a one-line reason."""

    path: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "reason": self.reason}


@dataclass(frozen=True)
class Discovery:
    """The answer of ``latest_valid``: the newest complete checkpoint and what was passed over.

    ``layout`` is the layout of ``latest``; when nothing is valid, the layout of the newest
    rejected candidate; ``None`` when no checkpoint of any layout was recognised.
    """

    latest: Checkpoint | None
    skipped: list[Skipped]
    layout: str | None

    def as_dict(self) -> dict[str, Any]:
        """The stable JSON shape of ``jobwrap checkpoints latest --json``."""
        return {"latest": self.latest.as_dict() if self.latest else None,
                "skipped": [s.as_dict() for s in self.skipped],
                "layout": self.layout}
