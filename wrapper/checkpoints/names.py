"""Numbers in free-form checkpoint names (``model_step1000.pt``, ``ckpt-12.pt``, ``step_5``).

Used by the layouts whose names follow no fixed scheme (plain torch files, DCP
directories, the generic glob): the number orders a name among names with the same
prefix, and is reported as a step only when the name says so (``step``, ``iter``,
``iteration``, ``global_step`` right before it).
"""

from __future__ import annotations

import re
from typing import NamedTuple

_SAID_STEP = re.compile(r"(?:^|[^a-z])(?:global_step|step|iteration|iter)[-_=]?(\d+)",
                        re.IGNORECASE)
_LAST_NUMBER = re.compile(r"(\d+)(?!.*\d)")


class Numbered(NamedTuple):
    series: str  # the part of the name before the number ("" when there is none)
    rank: int | None
    step: int | None


def numbered(stem: str) -> Numbered:
    """The series, ordering number and step a name carries; no number: rank None."""
    match = _SAID_STEP.search(stem)
    if match:
        value = int(match.group(1))
        return Numbered(stem[:match.start(1)], value, value)
    match = _LAST_NUMBER.search(stem)
    if match:
        return Numbered(stem[:match.start(1)], int(match.group(1)), None)
    return Numbered("", None, None)
