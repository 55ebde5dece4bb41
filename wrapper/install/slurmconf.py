"""The lines jobwrap needs in slurm.conf, merged into what a site already has.

A site's slurm.conf is its own: ``merge`` changes as little as it can and never replaces a
value. A parameter that is absent is added in one marked block at the end; a
comma-separated one (``PrologFlags``, ``SchedulerParameters``, ``JobSubmitPlugins``) gets
jobwrap's item added beside the site's; a ``Prolog``/``Epilog`` that is a folder glob
(``/etc/slurm/prolog.d/*``) gets jobwrap's hook as one more file there. Anything else that
differs (another program as ``Prolog``, a key set twice, set in an ``Include``d file, or
spread over continued lines) stops the merge with the reason and what to do, before
anything is written. Each change is recorded (``Edit``) so ``unmerge`` takes out exactly
what was put in, even after the site edited the file since.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path

from wrapper.errors import JobwrapError
from wrapper.fastdataclass import dataclass

BLOCK_HEADER = "# jobwrap: added by `jobwrap install`; `jobwrap uninstall` takes them out"
_ENTITY_KEYS = {"nodename", "partitionname", "nodeset", "downnodes", "frontendname",
                "switchname"}
_MAX_INCLUDE_DEPTH = 8
_MAX_BYTES = 4 << 20
# Slurm's own separator of a key and its value: spaces around '=', and an operator before
# it (Key+=v, Key-=v) that adds to or takes from a value set earlier
_SEPARATOR = re.compile(r"\s*([-*+/]?)=\s*")


class SlurmConfError(JobwrapError):
    """slurm.conf cannot be merged: the reasons, and nothing was changed."""

    def __init__(self, path: Path, problems: Sequence[str]) -> None:
        self.path, self.problems = path, list(problems)
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{path}: not changed:\n{lines}")


@dataclass(frozen=True)
class Want:
    """One thing jobwrap needs in slurm.conf.

    ``kind``: ``set`` (the value, or stop), ``item`` (one item of a comma-separated list),
    ``default`` (added when absent; a site's other value is only reported).
    """

    key: str
    value: str
    kind: str
    implied_by: tuple[str, ...] = ()  # items that already give it (Contain implies Alloc)
    folder_ok: bool = False  # Prolog/Epilog: a folder glob gets jobwrap's hook in it
    why: str = ""


@dataclass(frozen=True)
class Edit:
    """One change ``merge`` made: ``added`` a line (``value`` its value), ``extended`` a
    list (``value`` the item), or ``hook`` (``value`` the file put in a folder glob)."""

    key: str
    action: str
    value: str

    def as_dict(self) -> dict[str, str]:
        return {"key": self.key, "action": self.action, "value": self.value}


@dataclass(frozen=True)
class Merged:
    text: str
    edits: list[Edit]
    notes: list[str]  # what differs and was left as the site has it
    hooks: list[tuple[str, str]]  # (path, verb): jobwrap's hook to write into a folder glob


@dataclass(frozen=True)
class _Found:
    value: str
    file: Path
    line: int  # 1-based, the first physical line
    continued: bool


def wants(prefix: str) -> list[Want]:
    """What jobwrap needs, its hooks under ``prefix`` (docs: README, Installing)."""
    return [
        Want("Prolog", f"{prefix}/prolog/prolog", "set", folder_ok=True,
             why="runs jobwrap's checks before each job"),
        Want("Epilog", f"{prefix}/epilog/epilog", "set", folder_ok=True,
             why="runs jobwrap's verdict after each job"),
        Want("TaskProlog", f"{prefix}/prolog/task-prolog", "set",
             why="exports JOBWRAP_SCRATCH and the resume point to each task"),
        Want("PrologFlags", "Alloc", "item", implied_by=("contain", "runinjob"),
             why="runs the prolog on every node at allocation"),
        Want("SchedulerParameters", "nohold_on_prolog_fail", "item",
             why="a job whose prolog failed is requeued, not held"),
        Want("JobRequeue", "1", "default", why="failed jobs may be requeued"),
        Want("JobSubmitPlugins", "lua", "item", implied_by=("job_submit/lua",),
             why="job_submit.lua checks #JOBWRAP lines at sbatch"),
        Want("HealthCheckProgram", f"{prefix}/prolog/healthcheck", "default",
             why="returns a node jobwrap drained to service once its fault is gone"),
        Want("HealthCheckInterval", "300", "default", why="how often (seconds)"),
    ]


# -- reading -------------------------------------------------------------------------------
def _strip_comment(raw: str) -> str:
    return re.sub(r"(?<!\\)#.*", "", raw).rstrip()


def _logical(text: str) -> list[tuple[int, int, str]]:
    """(first line, last line, text) of each non-empty logical line (``\\`` continues)."""
    out: list[tuple[int, int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _strip_comment(raw)
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            out.append((start, number, line))
    if pending.strip():
        out.append((start, start, pending.strip()))
    return out


def read_text(path: Path) -> str:
    """slurm.conf's text, bounded; its problems as ``SlurmConfError``."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(_MAX_BYTES + 1)
    except OSError as exc:
        raise SlurmConfError(path, [f"cannot read it: {exc.strerror or exc}"]) from None
    if len(data) > _MAX_BYTES:
        raise SlurmConfError(path, [f"larger than {_MAX_BYTES >> 20} MiB: not a slurm.conf"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SlurmConfError(path, [f"byte {exc.start} is not UTF-8: save it as UTF-8"]
                             ) from None


def scan(path: Path, text: str | None = None, folder: Path | None = None
         ) -> tuple[dict[str, list[_Found]], list[str], list[str]]:
    """Every parameter of ``path`` and its includes (lower-case key -> where it is set),
    the entity lines (NodeName=..., PartitionName=...), and the problems found.
    ``folder``: where relative Includes are (slurm.conf's as Slurm is given it: a link's
    folder, not its target's)."""
    found: dict[str, list[_Found]] = {}
    entities: list[str] = []
    problems: list[str] = []
    _scan_file(path, folder or path.parent,
               text if text is not None else read_text(path), found, entities, problems,
               depth=0)
    return found, entities, problems


def _scan_file(path: Path, folder: Path, text: str, found: dict[str, list[_Found]],
               entities: list[str], problems: list[str], depth: int) -> None:
    for first, last, line in _logical(text):
        words = line.split(None, 1)
        if words[0].lower() == "include":
            if len(words) < 2:
                problems.append(f"{path}:{first}: Include names no file")
                continue
            _include(path, first, words[1].strip().strip('"'), folder, found, entities,
                     problems, depth)
            continue
        try:
            tokens = shlex.split(_SEPARATOR.sub(r"\1=", line), comments=False, posix=True)
        except ValueError as exc:
            problems.append(f"{path}:{first}: {exc} (a quote is not closed)")
            continue
        pairs = [t.partition("=") for t in tokens]
        bad = [t for t, (_, eq, _) in zip(tokens, pairs, strict=True) if not eq]
        if bad:
            problems.append(f"{path}:{first}: {bad[0][:60]!r} is not Key=Value (Slurm refuses "
                            "this line too)")
            continue
        if pairs[0][0].lower() in _ENTITY_KEYS:
            entities.append(line)
            continue
        for key, _, value in pairs:
            found.setdefault(key.lower(), []).append(_Found(value, path, first, last > first))


def _include(path: Path, line: int, pattern: str, folder: Path,
             found: dict[str, list[_Found]], entities: list[str], problems: list[str],
             depth: int) -> None:
    if depth >= _MAX_INCLUDE_DEPTH:
        problems.append(f"{path}:{line}: Include nested deeper than {_MAX_INCLUDE_DEPTH} "
                        "(a loop?)")
        return
    if "%" in pattern:
        problems.append(f"{path}:{line}: Include {pattern}: its %-expansion is Slurm's to "
                        "make at run time, so jobwrap cannot follow it; merge by hand "
                        "(README, Installing: the lines)")
        return
    full = pattern if os.path.isabs(pattern) else str(folder / pattern)
    matches = sorted(glob.glob(full))
    if not matches:
        problems.append(f"{path}:{line}: Include {pattern}: no such file (Slurm refuses "
                        "to start too)")
    for included in matches:
        try:
            text = read_text(Path(included))
        except SlurmConfError as exc:
            problems.extend(f"{included}: {p}" for p in exc.problems)
            continue
        _scan_file(Path(included), folder, text, found, entities, problems, depth + 1)


def host_nodes(path: Path, host: str) -> tuple[bool, list[str]]:
    """Whether ``host`` is a SlurmctldHost, and the Slurm names of the nodes it runs (its
    NodeHostname, else its NodeName, is ``host``)."""
    from wrapper.slurm.parse import expand_hostlist

    found, entities, _ = scan(path)
    controllers = [f.value.split("(")[0] for key in ("slurmctldhost", "controlmachine")
                   for f in found.get(key, [])]
    nodes: list[str] = []
    for line in entities:
        try:
            fields = {k.lower(): v for k, _, v in (t.partition("=")
                                                   for t in shlex.split(line))}
            if "nodename" not in fields or fields["nodename"].lower() == "default":
                continue
            names = expand_hostlist(fields["nodename"])
            hosts = expand_hostlist(fields.get("nodehostname") or fields["nodename"])
        except ValueError:
            continue
        if len(hosts) == len(names):
            nodes.extend(n for n, h in zip(names, hosts, strict=True) if h == host)
        elif host in hosts:
            nodes.extend(names)
    return host in controllers, nodes


# -- merging -------------------------------------------------------------------------------
def _items(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _folder_hook(pattern: str, verb: str) -> str | None:
    """Where jobwrap's hook goes for a folder glob ``dir/PRE*SUF``; None for another glob."""
    folder, name = os.path.split(pattern)
    if name.count("*") != 1 or re.search(r"[?\[\]]", pattern) or "*" in folder:
        return None
    before, after = name.split("*")
    return os.path.join(folder, f"{before}jobwrap-{verb}{after}")


def merge(path: Path, want: Iterable[Want], text: str | None = None,
          folder: Path | None = None) -> Merged:
    """slurm.conf with jobwrap's needs merged in; ``SlurmConfError`` lists every reason it
    cannot be, and then nothing is to be written."""
    text = read_text(path) if text is None else text
    found, _, problems = scan(path, text, folder)
    want = list(want)
    for w in want:
        for op in "+-*/":
            for place in found.get(f"{w.key.lower()}{op}", []):
                problems.append(f"{w.key}{op}={place.value} ({place.file}:{place.line}): "
                                f"jobwrap install does not merge into {op}= lines; write "
                                f"{w.key}'s whole value on one line")
    lines = text.splitlines(keepends=True)
    edits: list[Edit] = []
    notes: list[str] = []
    hooks: list[tuple[str, str]] = []
    added: list[str] = []
    for w in want:
        places = found.get(w.key.lower(), [])
        if len(places) > 1:
            where = ", ".join(f"{p.file}:{p.line}" for p in places)
            problems.append(f"{w.key} is set {len(places)} times ({where}): keep one")
            continue
        if not places:
            added.append(f"{w.key}={w.value}")
            edits.append(Edit(w.key, "added", w.value))
            continue
        place = places[0]
        value = place.value
        if w.kind == "default":
            if value.strip() != w.value:
                notes.append(f"{w.key}={value} kept ({place.file}:{place.line}); jobwrap's "
                             f"would be {w.value}: {w.why}")
            continue
        if w.kind == "set":
            if value == w.value:
                continue
            verb = w.value.rsplit("/", 1)[-1]
            target = _folder_hook(value, verb) if w.folder_ok else None
            if target is not None:
                hooks.append((target, verb))
                edits.append(Edit(w.key, "hook", target))
                continue
            problems.append(_set_conflict(w, place))
            continue
        have = [i.lower() for i in _items(value)]
        if w.value.lower() in have or any(i in have for i in w.implied_by):
            continue
        if place.file != path or place.continued:
            problems.append(f"{w.key}={value} ({place.file}:{place.line}) lacks {w.value} "
                            f"({w.why}): add it there by hand (`jobwrap install` changes "
                            f"only single lines of {path})")
            continue
        new_value = ",".join([*_items(value), w.value])
        lines[place.line - 1] = _replace_value(lines[place.line - 1], w.key, new_value)
        edits.append(Edit(w.key, "extended", w.value))
    if problems:
        raise SlurmConfError(path, problems)
    if added:
        header = next((i for i, line in enumerate(lines)
                       if line.rstrip("\n") == BLOCK_HEADER), None)
        if header is not None:  # the block of an earlier install: jobwrap's lines join it
            lines[header + 1:header + 1] = [f"{line}\n" for line in added]
        else:
            if lines and not lines[-1].endswith("\n"):
                lines[-1] += "\n"
                edits.append(Edit("", "final-newline", ""))
            lines += ["\n", f"{BLOCK_HEADER}\n", *(f"{line}\n" for line in added)]
    return Merged("".join(lines), edits, notes, hooks)


def _set_conflict(w: Want, place: _Found) -> str:
    where = f"{place.file}:{place.line}"
    if w.folder_ok:
        folder = f"/etc/slurm/{w.key.lower()}.d"
        return (f"{w.key}={place.value} ({where}): Slurm runs one {w.key} unless it names a "
                f"folder: move that program into a folder ({folder}/), set {w.key}="
                f"{folder}/* and run `jobwrap install` again; it adds its own hook there")
    return (f"{w.key}={place.value} ({where}): Slurm runs one {w.key}, and jobwrap needs "
            f"{w.value} ({w.why}): call it from your {w.key} (its output lines are the "
            "task's exports) and set "
            f"{w.key}= to yours, or set {w.key}={w.value}; then run `jobwrap install` again")


def _replace_value(line: str, key: str, value: str) -> str:
    pattern = re.compile(rf'(?i)(^|\s)({re.escape(key)}\s*=\s*)("[^"]*"|[^\s#]*)')
    quoted = '"' if re.search(rf'(?i)(^|\s){re.escape(key)}\s*=\s*"', line) else ""
    return pattern.sub(lambda m: f"{m.group(1)}{m.group(2)}{quoted}{value}{quoted}", line,
                       count=1)


def unmerge(path: Path, text: str, edits: Iterable[Edit]) -> tuple[str, list[str]]:
    """``text`` with ``edits`` taken out again; notes on those no longer there."""
    lines = text.splitlines(keepends=True)
    notes: list[str] = []
    edits = list(edits)
    for edit in edits:
        if edit.action == "added":
            wanted = f"{edit.key}={edit.value}"
            index = next((i for i, line in enumerate(lines) if line.strip() == wanted), None)
            if index is None:
                notes.append(f"{wanted}: no longer in {path} (changed since install); left")
                continue
            del lines[index]
        elif edit.action == "extended":
            found, _, _ = scan(path, "".join(lines))
            places = [p for p in found.get(edit.key.lower(), []) if p.file == path]
            if len(places) != 1:
                notes.append(f"{edit.key}: not on one line of {path} any more; take "
                             f"{edit.value} out of it by hand")
                continue
            place = places[0]
            kept = [i for i in _items(place.value) if i.lower() != edit.value.lower()]
            lines[place.line - 1] = _replace_value(lines[place.line - 1], edit.key,
                                                   ",".join(kept))
    out = _drop_empty_block("".join(lines))
    if any(e.action == "final-newline" for e in edits) and out.endswith("\n"):
        out = out[:-1]  # the file ended without one before jobwrap's block
    return out, notes


def _drop_empty_block(text: str) -> str:
    """``text`` without jobwrap's block header (its lines are out by now; a line the site
    added after them is the site's) and the blank line ``merge`` put before it."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.rstrip("\n") == BLOCK_HEADER:
            start = i - 1 if i > 0 and not lines[i - 1].strip() else i
            del lines[start:i + 1]
            break
    return "".join(lines)
