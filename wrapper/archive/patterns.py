"""Slurm's filename patterns (``%j``, ``%x``, ``%N`` ...) expanded the way Slurm expands them.

Slurm names a job's output files from patterns such as ``--output=%x-%j-%N.out``.
Depending on its version, ``scontrol show job`` has already replaced some of them
(22.05 replaces ``%A %a %j %u %x``, later versions all of them), so jobwrap expands what
is left with the same rules, taken from Slurm's ``expand_stdio_fields``:

========  ===============================================================
``%%``    a literal ``%``
``%A``    the array's master job id (the job id when it is no array job)
``%a``    the array task id (4294967294, Slurm's NO_VAL, when it is none)
``%b``    the array task id modulo 10
``%j``    the job id
``%J``    ``jobid.stepid`` (the job id alone for the batch script)
``%N``    the node's short name (the batch host for the batch script)
``%n``    the node's index in the job (0 for the batch script)
``%s``    the step id (``batch`` for the batch script)
``%t``    the task id (0 for the batch script)
``%u``    the user name
``%x``    the job name
========  ===============================================================

A number between ``%`` and the letter zero-pads a numeric field (at most 10 wide; ignored
for names); any other ``%c`` stays as it is; a backslash anywhere turns expansion off
for the whole name (the backslashes are dropped). A relative result is taken against
the job's work dir.
"""

from __future__ import annotations

import os

from wrapper.fastdataclass import dataclass

NO_VAL = 4294967294  # what Slurm prints for %a outside a job array
_FIELDS = frozenset("AabjJNnstux")
_MAX_PAD = 10


@dataclass(frozen=True)
class PatternValues:
    """What one job (and one step, node and task of it) puts into a filename pattern."""

    job_id: str
    user: str = ""
    job_name: str = ""
    node: str = ""
    node_index: int = 0
    array_job_id: str | None = None  # None: not an array job
    array_task_id: str | None = None
    step: str | None = None  # None: the batch script
    task: int = 0
    work_dir: str = ""


def expand(pattern: str, values: PatternValues) -> str:
    """``pattern`` with every field replaced; relative paths stay relative."""
    if "\\" in pattern:
        return pattern.replace("\\", "")
    out: list[str] = []
    i, end = 0, len(pattern)
    while i < end:
        char = pattern[i]
        if char != "%":
            out.append(char)
            i += 1
            continue
        i += 1
        if i >= end:
            break  # a lone trailing % is dropped, as Slurm does
        if pattern[i] == "%":
            out.append("%")
            i += 1
            continue
        digits_end = i
        while digits_end < end and pattern[digits_end].isdigit():
            digits_end += 1
        if digits_end > i:
            if digits_end < end and pattern[digits_end] in _FIELDS:
                width = min(int(pattern[i:digits_end]), _MAX_PAD)
                out.append(_field(pattern[digits_end], values, width))
                i = digits_end + 1
            else:
                # Slurm's own quirk: "%12q" keeps only the last digit ("2q").
                out.append(pattern[digits_end - 1])
                i = digits_end
            continue
        if pattern[i] in _FIELDS:
            out.append(_field(pattern[i], values, 0))
        else:
            out.append("%" + pattern[i])
        i += 1
    return "".join(out)


def resolve(pattern: str, values: PatternValues) -> str:
    """The expanded pattern as an absolute path (relative ones against the work dir)."""
    path = expand(pattern, values)
    if not os.path.isabs(path) and values.work_dir:
        path = os.path.join(values.work_dir, path)
    return path


def candidates(path: str, values: PatternValues) -> list[str]:
    """Where a path that Slurm may already have expanded can be, most likely first.

    A ``%`` left in it is either a field this Slurm version did not expand, or the ``%``
    that ``%%`` became in a version that expanded everything: both readings are tried.
    """
    first = resolve(path, values)
    plain = path if os.path.isabs(path) or not values.work_dir \
        else os.path.join(values.work_dir, path)
    return [first] if first == plain else [first, plain]


def _field(letter: str, values: PatternValues, width: int) -> str:
    if letter == "A":
        return _number(values.array_job_id or values.job_id, width)
    if letter == "a":
        return _number(values.array_task_id if values.array_task_id is not None
                       else str(NO_VAL), width)
    if letter == "b":
        task = values.array_task_id
        digit = str(int(task) % 10) if task is not None and task.isdigit() else str(NO_VAL % 10)
        return _number(digit, width)
    if letter == "j":
        return _number(values.job_id, width)
    if letter == "J":
        job = _number(values.job_id, width)
        return job if values.step in (None, "batch") else f"{job}.{values.step}"
    if letter == "N":
        return values.node
    if letter == "n":
        return _number(str(values.node_index), width)
    if letter == "s":
        return _number(values.step, width) if values.step is not None else "batch"
    if letter == "t":
        return _number(str(values.task), width)
    if letter == "u":
        return values.user
    return values.job_name  # "x"


def _number(text: str, width: int) -> str:
    return text.zfill(width) if width and text.isdigit() else text
