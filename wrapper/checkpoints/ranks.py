"""Rank sets in file names: every rank from 0 to the highest one seen must be there."""

from __future__ import annotations

from collections.abc import Iterable


def missing_ranks(ranks: Iterable[int]) -> int | None:
    """The lowest rank missing from 0..max(ranks); None when none is (or there are none)."""
    seen = set(ranks)
    if not seen:
        return None
    return next((r for r in range(max(seen) + 1) if r not in seen), None)
