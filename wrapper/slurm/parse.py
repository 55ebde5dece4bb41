"""Pure parsers for Slurm's text formats: host lists, exit codes, scontrol records."""

from __future__ import annotations

import re
from collections.abc import Sequence

from wrapper.errors import SlurmError

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")

MAX_HOSTS = 65_536  # more names than any cluster has: a larger list is not Slurm's
MAX_DIGITS = 9  # digits in one range bound (node999999999)
MAX_INDICES = 4096  # GPU indices in one list


class HostlistError(SlurmError, ValueError):
    """A host list that is malformed or names more hosts than jobwrap will expand."""


def expand_hostlist(text: str, *, max_hosts: int = MAX_HOSTS) -> list[str]:
    """Expand a Slurm host list: ``n[1-3,7],gpu-a[01-02]`` -> n1 n2 n3 n7 gpu-a01 gpu-a02.

    Handles several bracket groups in one name (``r[1-2]n[1-2]``) and keeps zero padding.
    Bounded: the number of names is counted before any is built, so ``n[0-99999999999]``
    is refused at once (HostlistError, a ValueError) instead of filling the memory.
    Raises HostlistError on unbalanced brackets, a bad range, a bound of more than
    MAX_DIGITS digits, or more than ``max_hosts`` names.
    """
    items = [item for item in _split_top_level(text.strip()) if item]
    total = 0
    for item in items:
        total += _count_one(item)
        if total > max_hosts:
            raise HostlistError(f"host list {_short(text)} names more than {max_hosts} hosts; "
                                "jobwrap expands at most that many (is it a real node list?)")
    names: list[str] = []
    for item in items:
        names.extend(_expand_one(item))
    return names


def _short(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested '[' in host list {_short(text)}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in host list {_short(text)}")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise HostlistError(f"unbalanced '[' in host list {_short(text)}")
    parts.append("".join(current))
    return parts


def _ranges(item: str, body: str) -> list[tuple[int, int, int]]:
    """The (lo, hi, zero-pad width) of each piece of one bracket group, checked."""
    out = []
    for piece in body.split(","):
        match = _RANGE.match(piece)
        if not match:
            raise HostlistError(f"bad range {_short(piece)} in host list entry {_short(item)}")
        lo_text, hi_text = match.group(1), match.group(2) or match.group(1)
        if max(len(lo_text), len(hi_text)) > MAX_DIGITS:
            raise HostlistError(f"range {_short(piece)} in host list entry {_short(item)} has "
                                f"a bound of more than {MAX_DIGITS} digits")
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise HostlistError(f"descending range {_short(piece)} in host list entry "
                                f"{_short(item)}")
        out.append((lo, hi, len(lo_text) if lo_text.startswith("0") else 0))
    return out


def _groups(item: str) -> tuple[list[str], list[list[tuple[int, int, int]]]]:
    """Split ``r[1-2]n[1-2]x`` into literal parts ["r", "n", "x"] and the bracket groups."""
    literals: list[str] = []
    groups: list[list[tuple[int, int, int]]] = []
    rest = item
    while True:
        start = rest.find("[")
        if start < 0:
            if "]" in rest:
                raise HostlistError(f"unbalanced ']' in host list entry {_short(item)}")
            literals.append(rest)
            return literals, groups
        end = rest.find("]", start)
        if end < 0:
            raise HostlistError(f"unbalanced '[' in host list entry {_short(item)}")
        literals.append(rest[:start])
        groups.append(_ranges(item, rest[start + 1:end]))
        rest = rest[end + 1:]


def _count_one(item: str) -> int:
    count = 1
    for group in _groups(item)[1]:
        count *= sum(hi - lo + 1 for lo, hi, _ in group)
        if count > MAX_HOSTS:  # stop multiplying early: r[..]n[..]x[..] stays small
            return count
    return count


def _expand_one(item: str) -> list[str]:
    literals, groups = _groups(item)
    out = [literals[0]]
    for literal, group in zip(literals[1:], groups, strict=True):
        out = [f"{head}{n:0{width}d}{literal}" for head in out
               for lo, hi, width in group for n in range(lo, hi + 1)]
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
        if len(match.group(0)) > 2 * MAX_DIGITS + 1 or hi - lo >= MAX_INDICES - len(out):
            raise ValueError(f"index list {_short(text)} names more than {MAX_INDICES} indices")
        out.extend(range(lo, hi + 1))
    return out


_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_record(line: str) -> dict[str, str]:
    """Parse one ``scontrol -o show node`` record of ``Key=Value`` pairs.

    Only for records no ordinary user writes (nodes: Slurm and admins). A job record holds
    the user's own text: read it with records.parse_job_text, never with this.

    Values may contain spaces (``Reason=jobwrap: ecc on gpu 1``): a value runs until the
    next `` Key=``.
    """
    matches = list(_KEY.finditer(line))
    record: dict[str, str] = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        record[match.group(1)] = line[match.end():end].strip()
    return record


_SIGNAL_DIRECTIVE = re.compile(r"^#SBATCH\b.*--signal[= ]", re.M)


def asks_signal(script: str) -> bool:
    """Whether a batch script asks Slurm for a signal before its time limit
    (``#SBATCH --signal=...``): the job saves on its own, jobwrap sends none."""
    return bool(_SIGNAL_DIRECTIVE.search(script))


_JOB_ID = re.compile(r"^[0-9]{1,12}(_[0-9]+)?$")
_NODE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def check_job_id(job_id: str) -> str:
    """``job_id`` if it is a Slurm job id (``123`` or ``123_4``), else SlurmError."""
    if not _JOB_ID.match(str(job_id)):
        raise SlurmError(f"{job_id!r} is not a Slurm job id")
    return str(job_id)


def check_node(node: str) -> str:
    """``node`` if it is a Slurm node name, else SlurmError."""
    if not _NODE.match(node):
        raise SlurmError(f"{node!r} is not a Slurm node name")
    return node


# srun's own errors when it cannot reach a node of its step (src/api/step_launch.c, the
# same words in 22.05 and 25.11): a launch that failed there for want of the node (the
# errno texts of a connection that failed, not a credential or exec error), or a node
# failure slurmctld told it of. A task's own death ("srun: error: n2: task 1: Killed")
# names its node too, but says nothing of the node: it is not read here.
_UNREACHED = re.compile(
    r"Task launch for \S+ failed on node ([A-Za-z0-9._-]{1,128}): (?:Communication connection"
    r" failure|Socket timed out|Zero Bytes were transmitted|Connection refused|No route to "
    r"host|Connection timed out)|Node failure on ([A-Za-z0-9._,\[\]-]{1,4096})")


def nodes_srun_lost(text: str, *, among: Sequence[str]) -> list[str]:
    """The nodes of ``among`` (the job's) that srun's errors in ``text`` say it could not
    reach, in ``among``'s order (``Task launch for StepId=7.1 failed on node n2:
    Communication connection failure``, ``Node failure on n[2-3]``). A name that does not
    read as a host list is skipped; a long list is read no further than ``among`` asks."""
    wanted = set(among)
    named: set[str] = set()
    for match in _UNREACHED.finditer(text):
        if match[1]:
            named.add(match[1])
            continue
        try:
            named.update(expand_hostlist(match[2], max_hosts=max(len(wanted), 1) * 4))
        except HostlistError:
            continue
    return [node for node in among if node in named]
