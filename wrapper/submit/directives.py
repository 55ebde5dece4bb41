"""``#JOBWRAP`` directives: the job's own options, read from its batch script.

They read like ``#SBATCH`` lines and, like them, are read only from the comment block
at the top of the script (up to the first command). The same options are accepted by
``jobwrap run``; both are declared once, in :data:`OPTIONS`.

The script is the user's text, read inside slurmctld (job_submit.lua, the same rules)
and by root's hooks, so reading it is bounded and linear whatever it holds:

- only the script's first :data:`HEADER_LINES` lines, and of them only those that end
  within its first :data:`HEADER_BYTES` bytes (UTF-8), are read for directives;
- lines, blanks and words are the ASCII ones job_submit.lua knows (:data:`WHITESPACE`,
  :data:`_BOUNDARY`, a POSIX shell's quoting as ``shlex.split``), found by searching,
  never by backtracking or by growing a string a character at a time;
- every number has a range, checked on its digits before any conversion:
  ``--max-restarts`` 0 to :data:`MAX_RESTARTS`, ``--spare-nodes`` 0 to
  :data:`MAX_SPARE_NODES`, ``--hang-timeout`` up to
  :data:`MAX_HANG_TIMEOUT` seconds (30 days);
- bytes that are not UTF-8 reach here as lone surrogates (``surrogateescape``); they
  are quoted as ``\\udcXX`` in messages and never raise.
"""

from __future__ import annotations

import re
from dataclasses import field, fields
from typing import TYPE_CHECKING, Any

from wrapper.errors import UserInputError
from wrapper.fastdataclass import dataclass

if TYPE_CHECKING:
    from wrapper.config import Config

PREFIX = "#JOBWRAP"
HEADER_BYTES = 256 * 1024
HEADER_LINES = 1000
MAX_RESTARTS = 1000
MAX_SPARE_NODES = 64
MAX_HANG_TIMEOUT = 30 * 86400
MAX_NUMBER_DIGITS = 9  # a whole-number value longer than this is out of range unread
MAX_DURATION_CHARS = 32  # a duration longer than this is none
# Python's str.strip() for ASCII (\x1c-\x1f included); job_submit.lua's WS.
WHITESPACE = " \t\n\r\v\f\x1c\x1d\x1e\x1f"
_BOUNDARY = re.compile(r"\r\n|[\n\r\v\f\x1c\x1d\x1e]")  # str.splitlines(), ASCII only
_BOUNDARY_BYTES = b"\n\r\v\f\x1c\x1d\x1e"
_SHELL_SPECIAL = re.compile(r"[ \t\r\n'\"\\]")
_IN_DOUBLE_QUOTES = re.compile(r'["\\]')
_DIGITS = re.compile(r"[0-9]+")
_INT = re.compile(r"[+-]?[0-9](?:_?[0-9])*")  # int()'s syntax, ASCII digits only
_DURATION = re.compile(r"(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")


@dataclass(frozen=True)
class Option:
    name: str  # as written: --checkpoint-dir
    kind: str  # "path" | "int" | "duration" | "spec" (repeatable) | "text" | "flag"
    help: str
    most: int = 0  # "int", "duration": the largest value accepted

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
    Option("--max-restarts", "int", f"Requeues of this job at most, 0 to {MAX_RESTARTS} "
           "(default: the site's).", MAX_RESTARTS),
    Option("--hang-timeout", "duration", "Declare the job hung after this long with no new "
           "checkpoint and no output (e.g. 30m, 1h, 90s, 01:30:00; at most 30 days), "
           "or off; not given: learned from the job's own progress cadence.",
           MAX_HANG_TIMEOUT),
    Option("--stage-in", "spec", "SRC[:DEST[:unpack]]: copy SRC to scratch before the job."),
    Option("--stage-out", "spec", "SRC:DEST: copy SRC from scratch to DEST after the job."),
    Option("--no-requeue", "flag", "Never requeue this job, whatever happens."),
    Option("--spare-nodes", "int", "Hold N extra nodes, watched while idle, that take a "
           f"failed node's place inside the allocation (0 to {MAX_SPARE_NODES}; needs a "
           "fixed #SBATCH --nodes and the command under jobwrap run).", MAX_SPARE_NODES),
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
    spare_nodes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobOptions:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for key in ("stage_in", "stage_out"):
            values[key] = tuple(values.get(key) or ())
        return cls(**values)


def _strip(text: str) -> str:
    return text.strip(WHITESPACE)


def _int(text: str) -> int:
    """Python's int() on ASCII text (blanks, a sign, single underscores); ValueError."""
    body = _strip(text)
    if len(body) > MAX_DURATION_CHARS or not _INT.fullmatch(body):
        raise ValueError(text)
    return int(body)


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``1h30m``, ``2d``, ``01:30:00``, ``1-00:00:00`` -> seconds.

    ASCII only, at most :data:`MAX_DURATION_CHARS` characters (so never a huge number);
    ValueError when it is no duration.
    """
    value = _strip(text)
    if not value or len(value) > MAX_DURATION_CHARS or not value.isascii():
        raise ValueError(f"not a duration: {text!r}")
    value = value.lower()
    if _DIGITS.fullmatch(value):
        return float(int(value))
    if ":" in value or "-" in value:
        days = 0
        if "-" in value:
            day_text, _, value = value.partition("-")
            days = _int(day_text)
        parts = [_int(p) for p in value.split(":")]
        if len(parts) > 3 or any(p < 0 for p in parts):
            raise ValueError(text)
        while len(parts) < 3:
            parts.insert(0, 0)
        hours, minutes, seconds = parts
        return float(days * 86400 + hours * 3600 + minutes * 60 + seconds)
    match = _DURATION.fullmatch(value)
    if not match or not any(match.groups()):
        raise ValueError(text)
    d, h, m, s = (int(g or 0) for g in match.groups())
    return float(d * 86400 + h * 3600 + m * 60 + s)


def header(script: str) -> str:
    """The part of ``script`` read for directives: whole lines within its first
    :data:`HEADER_BYTES` bytes (all of it when it is shorter)."""
    head = script[:HEADER_BYTES + 1]  # a character is a byte or more
    errors = "surrogateescape"
    try:
        raw = head.encode("utf-8", errors)
    except UnicodeEncodeError:  # a surrogate no decoder made: only from Python callers
        errors = "surrogatepass"
        raw = head.encode("utf-8", errors)
    if len(raw) <= HEADER_BYTES:
        return script
    raw = raw[:HEADER_BYTES]
    end = max(raw.rfind(bytes((b,))) for b in _BOUNDARY_BYTES)
    return raw[:end + 1].decode("utf-8", errors)


def _lines(script: str) -> list[str]:
    """The first :data:`HEADER_LINES` lines of the script's header, as splitlines()."""
    text = header(script)
    lines: list[str] = []
    start = 0
    for boundary in _BOUNDARY.finditer(text):
        if len(lines) >= HEADER_LINES:
            return lines
        lines.append(text[start:boundary.start()])
        start = boundary.end()
    if start < len(text) and len(lines) < HEADER_LINES:
        lines.append(text[start:])
    return lines


def directive_lines(script: str, prefix: str = PREFIX) -> list[tuple[int, str]]:
    """The ``#JOBWRAP`` lines of a script's header, with their line numbers."""
    out = []
    for number, raw in enumerate(_lines(script), start=1):
        line = _strip(raw)
        if number == 1 and line.startswith("#!"):
            continue
        if not line:
            continue
        if not line.startswith("#"):
            break  # like #SBATCH: the header ends at the first command
        if line.startswith(prefix) and (len(line) == len(prefix)
                                        or line[len(prefix)] in WHITESPACE):
            out.append((number, _strip(line[len(prefix):])))
    return out


def shell_words(text: str) -> list[str]:
    """``shlex.split(text, comments=False)``, in linear time; ValueError with shlex's
    own message ("No closing quotation", "No escaped character")."""
    words: list[str] = []
    pieces: list[str] | None = None  # the word being read; None between words
    i, n = 0, len(text)
    while i < n:
        special = _SHELL_SPECIAL.search(text, i)
        at = special.start() if special else n
        if at > i:
            pieces = pieces if pieces is not None else []
            pieces.append(text[i:at])
        if at >= n:
            break
        char = text[at]
        if char in " \t\r\n":
            if pieces is not None:
                words.append("".join(pieces))
                pieces = None
            i = at + 1
            continue
        pieces = pieces if pieces is not None else []
        if char == "\\":
            if at == n - 1:
                raise ValueError("No escaped character")
            pieces.append(text[at + 1])
            i = at + 2
        elif char == "'":
            close = text.find("'", at + 1)
            if close < 0:
                raise ValueError("No closing quotation")
            pieces.append(text[at + 1:close])
            i = close + 1
        else:  # a double quote: a backslash escapes only " and \ (and stays otherwise)
            j = at + 1
            while True:
                found = _IN_DOUBLE_QUOTES.search(text, j)
                if found is None:
                    raise ValueError("No closing quotation")
                q = found.start()
                pieces.append(text[j:q])
                if text[q] == '"':
                    i = q + 1
                    break
                if q == n - 1:
                    raise ValueError("No escaped character")
                escaped = text[q + 1]
                if escaped not in '"\\':
                    pieces.append("\\")
                pieces.append(escaped)
                j = q + 2
    if pieces is not None:
        words.append("".join(pieces))
    return words


def parse_script(script: str) -> JobOptions:
    """Parse every ``#JOBWRAP`` line of a batch script; the first error is raised.

    The message names the line, the option and what is expected, for ``sbatch``'s user.
    Any text gives options or a UserInputError, in time linear in the capped header.
    """
    args: list[tuple[int, str]] = []
    for number, text in directive_lines(script):
        try:
            words = shell_words(text)
        except ValueError as exc:
            raise UserInputError(f"#JOBWRAP line {number}: {exc} in {text!r}") from None
        args.extend((number, w) for w in words)
    return parse_args(args)


def parse_args(args: list[tuple[int, str]] | list[str]) -> JobOptions:
    """Parse options given as words (``--opt=value`` or ``--opt value``)."""
    items: list[tuple[int, str]] = [a if isinstance(a, tuple) else (0, a) for a in args]
    values: dict[str, Any] = {}
    repeated: dict[str, list[str]] = {}
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
        converted = _convert(option, value, where)
        if option.kind == "spec":
            repeated.setdefault(option.attr, []).append(converted)
        else:
            values[option.attr] = converted
    values.update((attr, tuple(items)) for attr, items in repeated.items())
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


def _convert(option: Option, value: str, where: str) -> Any:
    name = option.name
    if "\x00" in value or "\n" in value:
        raise UserInputError(f"{where}: {name} value holds a control character")
    if option.kind == "int":
        # The digits are counted before they are converted: never a 4,301-digit int().
        if len(value) > MAX_NUMBER_DIGITS or not _DIGITS.fullmatch(value) \
                or int(value) > option.most:
            raise UserInputError(f"{where}: {name}={value!r}: expected a whole number from "
                                 f"0 to {option.most}, e.g. {name}=3")
        return int(value)
    if option.kind == "duration":
        if name == "--hang-timeout" and value == "off":
            return 0.0  # no hang detection for this job (not given: learned, see config)
        try:
            seconds = parse_duration(value)
        except ValueError:
            raise UserInputError(f"{where}: {name}={value!r}: expected a duration such as "
                                 "90s, 30m, 1h30m or 01:30:00, at most 30 days") from None
        if seconds <= 0:
            raise UserInputError(f"{where}: {name} must be longer than 0 s")
        if seconds > option.most:
            raise UserInputError(f"{where}: {name}={value!r}: at most 30 days "
                                 f"({option.most} s)")
        return seconds
    if not value:
        raise UserInputError(f"{where}: {name} needs a non-empty value")
    return value


def allowed_restarts(options: JobOptions, cfg: Config) -> int:
    """The restarts the job gets: its --max-restarts, or ``[restart] max_restarts``, and
    never more than ``[restart] max_restarts_limit`` (job_submit.lua refuses more at
    submit, but a job's directives can be rewritten after it: ``scontrol update
    Extra=``)."""
    asked = options.max_restarts if options.max_restarts is not None \
        else cfg.restart.max_restarts
    limit = cfg.restart.max_restarts_limit
    return min(asked, limit) if limit >= 0 else asked
