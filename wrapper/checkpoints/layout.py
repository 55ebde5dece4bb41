"""What a checkpoint layout is (a Protocol), the candidates layouts propose, and their registry.

A layout is one small module in ``wrapper/checkpoints/layouts/`` that ends with
``register(TheLayout())``; the registry imports every module of that package, so adding
a layout touches one file. Layouts come in tiers: tier 0 are the layouts recognised by
their own names (Lightning, Hugging Face, DeepSpeed, Megatron); tier 1 are fallbacks
(plain ``torch.save`` files, torch.distributed.checkpoint directories) consulted only
when no tier-0 layout recognised anything, so that the final ``pytorch_model.bin`` a
Hugging Face run leaves beside its ``checkpoint-N/`` directories is never taken for a
checkpoint. Within a tier, layouts claim entries in name order and never share one.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from wrapper.checkpoints.listing import Entry, Listing
from wrapper.errors import JobwrapError


class Rejected(Exception):  # a verdict carried up to discovery
    """A candidate is not a usable checkpoint; the message is the one-line reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NotACheckpoint(Exception):
    """A proposed candidate turned out not to be a checkpoint at all: ignore it silently."""


@dataclass(frozen=True, slots=True)
class Context:
    """What a layout's inspection may need besides the candidate itself."""

    real_root: str  # the directory with every symlink resolved: the containment boundary
    now: float
    settle_seconds: float


@dataclass(slots=True, eq=False)
class Candidate:
    """A name a layout proposes, ordered before any I/O by ``series`` and ``rank``.

    Candidates of one ``series`` are ordered by ``rank`` (a number their names carry;
    ``None`` for all of a series ordered by mtime instead); different series are merged
    by modification time. A series name starts with its layout's name ("lightning:step")
    and is either ranked or not throughout. ``reason`` rejects a candidate up front (a
    DeepSpeed tag newer than the one ``latest`` names); ``entry`` is None for a name that
    does not exist.
    """

    name: str
    entry: Entry | None
    layout: Layout
    series: str
    rank: int | None = None
    step: int | None = None
    expect_dir: bool | None = False  # None: either a file or a directory is fine
    reason: str | None = None
    evidence: tuple[str, ...] = ()  # names in the directory whose mtimes count for settling
    order_name: str | None = None  # the entry whose mtime orders it, when not its own


@runtime_checkable
class Layout(Protocol):
    """One checkpoint layout: proposes candidates from a listing, then judges one at a time."""

    name: str  # reported as Checkpoint.layout
    tier: int  # 0: recognised by its names; 1: fallback when no tier-0 layout matched

    def candidates(self, listing: Listing) -> list[Candidate]:
        """Claim this layout's entries (``entry.claimed = True``) and propose candidates.

        Only names and at most a small pointer file may be read here: this runs over
        every entry of the directory.
        """
        ...

    def inspect(self, candidate: Candidate, path: str, st: os.stat_result,
                ctx: Context) -> float:
        """Judge one candidate (``path`` is safe to open; ``st`` is its stat).

        Returns the newest mtime among its completion evidence (a marker file), or
        ``st.st_mtime``; raises Rejected with the reason, or NotACheckpoint.
        """
        ...


_REGISTRY: list[Layout] = []
_loaded = False


def register(layout: Layout) -> Layout:
    """Add a layout to the registry (called once at the bottom of its module)."""
    if not isinstance(layout, Layout):
        raise TypeError(f"{layout!r} does not implement the checkpoint Layout protocol")
    if any(known.name == layout.name for known in _REGISTRY):
        raise ValueError(f"two checkpoint layouts are called {layout.name!r}")
    _REGISTRY.append(layout)
    return layout


def registered() -> tuple[Layout, ...]:
    """Every registered layout, in claiming order: by tier, then by name."""
    global _loaded
    if not _loaded:
        from wrapper.checkpoints import layouts

        found = list(pkgutil.iter_modules(layouts.__path__))
        if not found:  # a folder this process cannot list: never an empty registry
            raise JobwrapError(f"no checkpoint layout could be loaded from "
                               f"{', '.join(layouts.__path__)}: jobwrap's install must be "
                               "readable by every user (it reads a job's checkpoints with "
                               "the job user's rights)")
        for module in found:
            importlib.import_module(f"{layouts.__name__}.{module.name}")
        _loaded = True
    return tuple(sorted(_REGISTRY, key=lambda layout: (layout.tier, layout.name)))
