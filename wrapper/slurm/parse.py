"""Pure parsers for Slurm's text formats: host lists, exit codes, scontrol records."""

from __future__ import annotations

import re

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm host list: ``n[1-3,7],gpu-a[01-02]`` -> n1 n2 n3 n7 gpu-a01 gpu-a02.

    Handles several bracket groups in one name (``r[1-2]n[1-2]``) and keeps zero padding.
    Raises ValueError on unbalanced brackets or a bad range.
    """
    names: list[str] = []
    for item in _split_top_level(text.strip()):
        if item:
            names.extend(_expand_one(item))
    return names


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced '[' in host list {text!r}")
    parts.append("".join(current))
    return parts


def _expand_one(item: str) -> list[str]:
    start = item.find("[")
    if start < 0:
        return [item]
    end = item.index("]", start)
    prefix, body, suffix = item[:start], item[start + 1:end], item[end + 1:]
    tails = _expand_one(suffix) if suffix else [""]
    out = []
    for piece in body.split(","):
        match = _RANGE.match(piece)
        if not match:
            raise ValueError(f"bad range {piece!r} in host list entry {item!r}")
        lo_text, hi_text = match.group(1), match.group(2) or match.group(1)
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise ValueError(f"descending range {piece!r} in host list entry {item!r}")
        width = len(lo_text) if lo_text.startswith("0") else 0
        for n in range(lo, hi + 1):
            for tail in tails:
                out.append(f"{prefix}{n:0{width}d}{tail}")
    return out


def split_wait_status(status: int) -> tuple[int, int]:
    """Split a wait status (SLURM_JOB_EXIT_CODE, e.g. 768) into (exit code, signal)."""
    return (status >> 8) & 0xFF, status & 0x7F


def parse_exit_pair(text: str) -> tuple[int, int]:
    """Parse Slurm's ``exit:signal`` form (SLURM_JOB_EXIT_CODE2, sacct ExitCode)."""
    code, _, sig = text.strip().partition(":")
    return int(code), int(sig or 0)


def parse_index_list(text: str) -> list[int]:
    """Parse a GPU index list such as ``0,1,3`` or ``0-3,6`` (SLURM_JOB_GPUS)."""
    out: list[int] = []
    for piece in text.split(","):
        piece = piece.strip()
        if not piece:
            continue
        match = _RANGE.match(piece)
        if not match:
            raise ValueError(f"bad index {piece!r} in {text!r}")
        lo, hi = int(match.group(1)), int(match.group(2) or match.group(1))
        out.extend(range(lo, hi + 1))
    return out


_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_record(line: str) -> dict[str, str]:
    """Parse one ``scontrol -o show ...`` record of ``Key=Value`` pairs.

    Values may contain spaces (``Reason=jobwrap: ecc on gpu 1``): a value runs until the
    next `` Key=``.
    """
    matches = list(_KEY.finditer(line))
    record: dict[str, str] = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        record[match.group(1)] = line[match.end():end].strip()
    return record
