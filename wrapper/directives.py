"""``#JOBWRAP`` directives: the job's own options, read from its batch script.

They read like ``#SBATCH`` lines and, like them, are read only from the comment block
at the top of the script (up to the first command). The same options are accepted by
``jobwrap run``; both are declared once, in :data:`OPTIONS`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field, fields
from typing import Any

from wrapper.errors import UserInputError

PREFIX = "#JOBWRAP"


@dataclass(frozen=True)
class Option:
    name: str  # as written: --checkpoint-dir
    kind: str  # "path" | "int" | "duration" | "spec" (repeatable) | "text" | "flag"
    help: str

    @property
    def attr(self) -> str:
        return self.name.lstrip("-").replace("-", "_")


OPTIONS: tuple[Option, ...] = (
    Option("--checkpoint-dir", "path", "Where the job writes its checkpoints (relative: to "
           "the job's working directory)."),
    Option("--checkpoint-glob", "text", "Generic checkpoint layout: a glob inside "
           "--checkpoint-dir, for formats jobwrap does not know."),
    Option("--checkpoint-marker", "text", "Generic layout: a file that marks a checkpoint "
           "complete."),
    Option("--max-restarts", "int", "Requeues of this job at most (default: the site's)."),
    Option("--hang-timeout", "duration", "Declare the job hung after this long with no new "
           "checkpoint and no output (e.g. 30m, 1h, 90s, 01:30:00)."),
    Option("--stage-in", "spec", "SRC[:DEST[:unpack]]: copy SRC to scratch before the job."),
    Option("--stage-out", "spec", "SRC:DEST: copy SRC from scratch to DEST after the job."),
    Option("--no-requeue", "flag", "Never requeue this job, whatever happens."),
)
_BY_NAME = {o.name: o for o in OPTIONS}


@dataclass(frozen=True)
class JobOptions:
    checkpoint_dir: str | None = None
    checkpoint_glob: str | None = None
    checkpoint_marker: str | None = None
    max_restarts: int | None = None
    hang_timeout: float | None = None
    stage_in: tuple[str, ...] = field(default_factory=tuple)
    stage_out: tuple[str, ...] = field(default_factory=tuple)
    no_requeue: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobOptions:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for key in ("stage_in", "stage_out"):
            values[key] = tuple(values.get(key) or ())
        return cls(**values)


_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``1h30m``, ``2d``, ``01:30:00``, ``1-00:00:00`` -> seconds."""
    value = text.strip().lower()
    if not value:
        raise ValueError("empty duration")
    if value.isdigit():
        return float(value)
    if ":" in value or "-" in value:
        days = 0
        if "-" in value:
            day_text, _, value = value.partition("-")
            days = int(day_text)
        parts = [int(p) for p in value.split(":")]
        if len(parts) > 3 or any(p < 0 for p in parts):
            raise ValueError(text)
        while len(parts) < 3:
            parts.insert(0, 0)
        hours, minutes, seconds = parts
        return float(days * 86400 + hours * 3600 + minutes * 60 + seconds)
    match = _DURATION.match(value)
    if not match or not any(match.groups()):
        raise ValueError(text)
    d, h, m, s = (int(g or 0) for g in match.groups())
    return float(d * 86400 + h * 3600 + m * 60 + s)


def directive_lines(script: str) -> list[tuple[int, str]]:
    """The ``#JOBWRAP`` lines of a script's header, with their line numbers."""
    out = []
    for number, raw in enumerate(script.splitlines(), start=1):
        line = raw.strip()
        if number == 1 and line.startswith("#!"):
            continue
        if not line:
            continue
        if not line.startswith("#"):
            break  # like #SBATCH: the header ends at the first command
        if line.startswith(PREFIX) and (len(line) == len(PREFIX) or line[len(PREFIX)].isspace()):
            out.append((number, line[len(PREFIX):].strip()))
    return out


def parse_script(script: str) -> JobOptions:
    """Parse every ``#JOBWRAP`` line of a batch script; the first error is raised.

    The message names the line, the option and what is expected, for ``sbatch``'s user.
    """
    args: list[tuple[int, str]] = []
    for number, text in directive_lines(script):
        try:
            words = shlex.split(text, comments=False)
        except ValueError as exc:
            raise UserInputError(f"#JOBWRAP line {number}: {exc} in {text!r}") from None
        args.extend((number, w) for w in words)
    return parse_args(args)


def parse_args(args: list[tuple[int, str]] | list[str]) -> JobOptions:
    """Parse options given as words (``--opt=value`` or ``--opt value``)."""
    items: list[tuple[int, str]] = [a if isinstance(a, tuple) else (0, a) for a in args]
    values: dict[str, Any] = {}
    i = 0
    while i < len(items):
        number, word = items[i]
        where = f"#JOBWRAP line {number}" if number else "option"
        name, eq, value = word.partition("=")
        option = _BY_NAME.get(name)
        if option is None:
            valid = ", ".join(o.name for o in OPTIONS)
            raise UserInputError(f"{where}: unknown option {name!r}; valid options: {valid}")
        if option.kind == "flag":
            if eq:
                raise UserInputError(f"{where}: {name} takes no value")
            values[option.attr] = True
            i += 1
            continue
        if not eq:
            if i + 1 >= len(items) or items[i + 1][1].startswith("--"):
                raise UserInputError(f"{where}: {name} needs a value ({name}=VALUE)")
            value = items[i + 1][1]
            i += 1
        i += 1
        values[option.attr] = _convert(option, value, where, values.get(option.attr))
    return JobOptions(**values)


def split_run_args(words: list[str]) -> tuple[list[str], list[str]]:
    """Split ``jobwrap run`` words into leading jobwrap options and the command."""
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            return words[:i], words[i + 1:]
        if not word.startswith("--"):
            break
        option = _BY_NAME.get(word.partition("=")[0])
        if option is None:
            break  # not ours: parse_args on the options will not see it; CMD starts here
        i += 1 if ("=" in word or option.kind == "flag") else 2
    return words[:i], words[i:]


def _convert(option: Option, value: str, where: str, previous: Any) -> Any:
    name = option.name
    if "\x00" in value or "\n" in value:
        raise UserInputError(f"{where}: {name} value holds a control character")
    if option.kind == "int":
        if not value.isdigit():
            raise UserInputError(f"{where}: {name}={value!r}: expected a whole number >= 0, "
                                 f"e.g. {name}=3")
        return int(value)
    if option.kind == "duration":
        try:
            seconds = parse_duration(value)
        except ValueError:
            raise UserInputError(f"{where}: {name}={value!r}: expected a duration such as "
                                 "90s, 30m, 1h30m or 01:30:00") from None
        if seconds <= 0:
            raise UserInputError(f"{where}: {name} must be longer than 0 s")
        return seconds
    if not value:
        raise UserInputError(f"{where}: {name} needs a non-empty value")
    if option.kind == "spec":
        return (*(previous or ()), value)
    return value
