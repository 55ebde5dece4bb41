"""PyTorch's flight recorder: on for the job's ranks, read where a rank dumped it, and the
ranks that never joined a collective named.

PyTorch records each collective of each rank in a ring buffer (``TORCH_FR_BUFFER_SIZE``
entries; formerly ``TORCH_NCCL_TRACE_BUFFER_SIZE``): its process group, its sequence
number there, its name (``nccl:all_reduce``, ``gloo:all_reduce``), its state
(``scheduled``, ``started``, ``completed``: gloo leaves every entry ``scheduled``) and
the Python frames that called it. NCCL's watchdog writes it to
``TORCH_FR_DUMP_TEMP_FILE`` + the rank when a collective times out
(``TORCH_NCCL_DUMP_ON_TIMEOUT``); a job can write it itself at any time
(``torch._C._distributed_c10d._dump_fr_trace``). The ranks of a collective that one or
more never joined are told apart by their sequence numbers: the ones that did reached
it, the others stopped before.

- ``exports``: what the task-prolog sets in each task, unless the job set it itself
  (a dump file jobwrap named is always set anew: it names the task's own node):
  the buffer (``[pulse] flight_recorder`` entries, 0: off), the dump file in the task's
  node-local scratch (``.flight-recorder/rank_``) and NCCL's dump on timeout. Cost: the
  buffer holds entries of a few hundred bytes each (2,000: under 1 MB a rank), and each
  collective records one (a few microseconds; PyTorch's own docs call it lightweight).
- ``read_folder`` (as the job's user, in the watcher's child: the folder is the user's):
  each dump there, bounded in count and size, parsed as JSON or as a pickle that may
  hold no global at all (``_plain``: nothing of the file runs), summarised per rank and
  process group (``summarise``).
- ``not_joined`` (pure): the ranks behind the others in a process group, named.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from typing import Any

BUFFER = "TORCH_FR_BUFFER_SIZE"
LEGACY_BUFFER = "TORCH_NCCL_TRACE_BUFFER_SIZE"
DUMP_FILE = "TORCH_FR_DUMP_TEMP_FILE"
DUMP_ON_TIMEOUT = "TORCH_NCCL_DUMP_ON_TIMEOUT"
FOLDER = ".flight-recorder"  # in the job's scratch on each node
PREFIX = "rank_"
FILES_MAX = 64  # dumps read on one node (its ranks)
FILE_MAX = 8 << 20  # bytes of one dump
GROUPS_MAX = 4  # process groups told per rank (the ones with the newest collectives)
TEXT_MAX = 120
SEQ_MAX = 1 << 63  # a sequence number past this is no recorder's


def exports(entries: int, scratch: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables the task-prolog sets (the job's own values win)."""
    if entries <= 0 or not scratch:
        return {}
    out = {}
    if BUFFER not in environ and LEGACY_BUFFER not in environ:
        out[BUFFER] = str(entries)
    if DUMP_FILE not in environ or dump_folder(environ):
        # jobwrap's own value is this node's: a step's tasks on other nodes inherit the
        # batch step's (srun passes the batch shell's environment), which names its node
        out[DUMP_FILE] = f"{scratch}/{FOLDER}/{PREFIX}"
    if DUMP_ON_TIMEOUT not in environ:
        out[DUMP_ON_TIMEOUT] = "1"
    return out


def dump_folder(values: Mapping[str, str]) -> str | None:
    """The folder the dump file named in ``values`` goes to, when it is jobwrap's."""
    target = values.get(DUMP_FILE, "")
    return os.path.dirname(target) if target.endswith(f"/{FOLDER}/{PREFIX}") else None


class DumpError(ValueError):
    """A dump that is not one: unreadable, too large, or not the recorder's shape."""


def _plain(raw: bytes) -> Any:
    """A pickle of plain values only (dicts, lists, tuples, strings, numbers): the
    recorder writes nothing else, and a file that names any class or function is refused
    before anything of it runs (imported here: the task-prolog imports this module)."""
    import io
    import pickle

    class Plain(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            raise DumpError(f"the dump names {module[:40]}.{name[:40]}: "
                            "not a flight recorder's")

    return Plain(io.BytesIO(raw)).load()


def parse(raw: bytes) -> dict[str, Any]:
    """A dump's content: JSON (``_dump_fr_trace_json``) or pickle (NCCL's dump)."""
    import json

    try:
        data = json.loads(raw) if raw.lstrip()[:1] == b"{" else _plain(raw)
    except DumpError:
        raise
    except Exception as exc:  # a pickle's errors are of many kinds; none is a traceback
        raise DumpError(f"does not parse: {type(exc).__name__}") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise DumpError("no entries: not a flight recorder's dump")
    return data


def _text(value: Any) -> str:
    """A short printable ASCII text of a string or number: cut before it is looked at (a
    pickle can hand the same huge string, or a deep list, in many places); anything
    else is "?"."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        return "?"
    raw = value[:TEXT_MAX] if isinstance(value, str) else \
        (str(value) if abs(value) < SEQ_MAX else "?")
    return "".join(c if c.isascii() and c.isprintable() else "?" for c in raw)


def _frame(entry: Mapping[str, Any]) -> str:
    """The innermost frame outside torch: where the job called the collective."""
    frames = entry.get("frames")
    for frame in frames[:64] if isinstance(frames, list) else []:
        if not isinstance(frame, dict):
            continue
        path = frame.get("filename")
        path = path[-400:] if isinstance(path, str) else "?"
        if "/torch/" not in path:
            return _text(f"{_text(frame.get('name'))} ({_text(os.path.basename(path))}:"
                         f"{_text(frame.get('line'))})")
    return ""


def summarise(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per process group, the newest collective the rank entered: ``pg``, ``seq``,
    ``op``, ``state``, ``at`` (the job's frame); at most GROUPS_MAX groups."""
    newest: dict[str, dict[str, Any]] = {}
    for entry in data.get("entries") or []:
        if not isinstance(entry, dict) or entry.get("is_p2p"):
            continue
        seq = entry.get("collective_seq_id")
        group = entry.get("process_group")
        name = group[0] if isinstance(group, list | tuple) and group else entry.get("pg_id")
        if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq < SEQ_MAX \
                or name is None:
            continue
        pg = _text(name)
        if pg not in newest or seq > newest[pg]["seq"]:
            newest[pg] = {"pg": pg, "seq": seq, "op": _text(entry.get("profiling_name", "")),
                          "state": _text(entry.get("state", "")), "at": _frame(entry)}
    return sorted(newest.values(), key=lambda g: -g["seq"])[:GROUPS_MAX]


def read_folder(folder: str) -> list[dict[str, Any]]:
    """Every rank's dump in ``folder`` (run as the job's user): ``{"rank", "groups"}`` or
    ``{"rank", "error"}``; [] when there is none. Never follows a link; never raises."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return []
    out: list[dict[str, Any]] = []
    try:
        names = []
        with os.scandir(fd) as entries:
            for entry in entries:
                digits = entry.name[len(PREFIX):]
                if entry.name.startswith(PREFIX) and digits.isascii() and digits.isdigit() \
                        and len(digits) < 8:
                    names.append((int(digits), entry.name))
                if len(names) >= FILES_MAX * 4:
                    break
        for rank, name in sorted(names)[:FILES_MAX]:
            try:
                raw = _read(fd, name)
                out.append({"rank": rank, "groups": summarise(parse(raw)),
                            "mtime": _mtime(fd, name)})
            except (OSError, DumpError) as exc:
                out.append({"rank": rank, "error": _text(str(exc))})
            except Exception as exc:  # one hostile file costs its own rank only
                out.append({"rank": rank, "error": f"not read: {type(exc).__name__}"})
    except OSError:
        pass
    finally:
        os.close(fd)
    return out


def _mtime(folder_fd: int, name: str) -> float:
    try:
        return os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


def _read(folder_fd: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise DumpError("not a regular file")
        if info.st_size > FILE_MAX:
            raise DumpError(f"{info.st_size} bytes: over {FILE_MAX}")
        chunks, left = [], FILE_MAX + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise DumpError(f"over {FILE_MAX} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def not_joined(ranks: Iterable[Mapping[str, Any]]) -> tuple[list[str], str]:
    """The ranks behind the others (``read_folder``'s records, every node's): each
    named with the collective it never joined; and one line of what the recorder says
    ("" when no group has ranks at different places)."""
    by_group: dict[str, dict[int, dict[str, Any]]] = {}
    for record in ranks:
        rank, groups = record.get("rank"), record.get("groups")
        if not isinstance(rank, int) or not isinstance(groups, list):
            continue
        for group in groups:
            if isinstance(group, dict) and isinstance(group.get("seq"), int):
                by_group.setdefault(str(group.get("pg")), {})[rank] = group
    named: list[str] = []
    said: list[str] = []
    for pg, members in sorted(by_group.items()):
        top = max(g["seq"] for g in members.values())
        ahead = [r for r, g in members.items() if g["seq"] == top]
        behind = sorted(r for r, g in members.items() if g["seq"] < top)
        if not behind:
            continue
        op = members[ahead[0]]["op"] or "a collective"
        for rank in behind:
            g = members[rank]
            where = f" at {g['at']}" if g.get("at") else ""
            named.append(f"rank {rank} never joined {op} #{top} of process group {pg} "
                         f"(its last: #{g['seq']}{where})")
        said.append(f"process group {pg}: {len(ahead)} of {len(members)} ranks entered "
                    f"{op} #{top}, {len(behind)} stopped before")
    return named, "; ".join(said)
