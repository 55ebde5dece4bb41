"""JSON from text a user could write, decoded so that no content can make root's reader fail.

Root reads JSON the job's user wrote or could have shaped: their ``user-events.jsonl``,
a checkpoint's safetensors header and weights index, a run-as-user helper's answer, the
job's own log lines. ``json.loads`` alone lets such text raise what callers do not catch
(RecursionError on 100,000 ``[``; an int of 4,300 digits whose ``float()`` overflows),
keep values no reader expects (NaN and Infinity sort and compare wrong), or cost without
bound (a 1 GiB line). :func:`loads` answers ``None`` for all of those, and for every
other decoding error, so a caller drops the one line and goes on:

- at most ``max_bytes`` of text (a longer line is not decoded at all);
- nesting at most ``max_depth`` deep (objects and arrays);
- integers of at most 300 digits, only finite floats, no NaN/Infinity constants;
- UTF-8 text only.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_LINE = 1 << 20   # bytes of one JSON text (one event line)
MAX_DEPTH = 32       # objects and arrays inside each other
MAX_DIGITS = 300     # an integer's digits: float() of any such int is finite


class _Refused(ValueError):
    pass


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise _Refused("integer too long")
    return int(text)


def _parse_float(text: str) -> float:
    if len(text) > 64:
        raise _Refused("number too long")
    value = float(text)
    if not math.isfinite(value):
        raise _Refused("number out of range")
    return value


def _parse_constant(_name: str) -> Any:
    raise _Refused("NaN and Infinity are not JSON")


_DECODER = json.JSONDecoder(parse_int=_parse_int, parse_float=_parse_float,
                            parse_constant=_parse_constant)


def loads(data: bytes | str, *, max_bytes: int = MAX_LINE, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value of ``data``; None when it is not a bounded, well-formed JSON text."""
    if len(data) > max_bytes:
        return None
    try:
        text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
        value = _DECODER.decode(text)
    except Exception:
        return None
    # Cheap test first: a text with fewer brackets than the bound cannot nest deeper.
    brackets = text.count("[") + text.count("{")
    if brackets > max_depth and _depth(value, max_depth) > max_depth:
        return None
    return value


def loads_object(data: bytes | str, *, max_bytes: int = MAX_LINE,
                 max_depth: int = MAX_DEPTH) -> dict[str, Any] | None:
    """:func:`loads`, and only a JSON object: anything else is None."""
    value = loads(data, max_bytes=max_bytes, max_depth=max_depth)
    return value if isinstance(value, dict) else None


def _depth(value: Any, bound: int) -> int:
    """How deep ``value`` nests, counted without recursion; stops once past ``bound``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > bound:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest
