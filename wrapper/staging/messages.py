"""What root and the staging worker say to each other: one frozen record per kind, and the
one decoder that bounds what crosses.

The worker runs with the job user's rights, so what it sends is the user's word: root
decodes every message with :func:`decode` before looking at it, and the worker decodes
root's answers the same way. On the wire a message is a JSON object ``{"t": KIND,
...fields}`` (``wrapper.staging.channel`` carries it, descriptors riding along); its
fields must be exactly those its record encodes, each of its type and within its bounds.
Anything else raises :class:`MessageError` (a StagingError: the stage fails, root's hook
does not), with a message that says what was wrong and never echoes more than a few
characters of what was sent.

The conversation of a stage-in, per directive, when a cache is used (root's side is
``wrapper.staging.server``, the worker's ``wrapper.staging.worker``)::

    worker -> root   CacheAsk {index, manifest, scan_seconds} + the source's descriptor
    root -> worker   Send | Direct             (miss | cannot cache: copy it yourself)
    worker -> root   Fds {paths} + descriptors (a batch of one folder); root answers
                     More on receipt, or Direct when the cache turned out full ...
    worker -> root   FdsEnd
    root -> worker   Placed | Unpack {hit, wait} + the entry's descriptor | Direct

and, from the worker, ``ProgressNote`` now and then, ``ItemDone`` per directive it staged
itself, and ``End``. A stage-out's worker sends those last three only. (A worker that
fails sends the channel's own ``error`` message: ``wrapper.staging.privileges``.)

Bounds: ``index`` below ``MAX_DIRECTIVES``; counts, sizes and modes from 0 to
``MAX_COUNT`` (``off_t``'s largest), times in nanoseconds from 0 to ``MAX_TIME_NS``
(``time_t``'s largest second); durations finite, from 0 to ``MAX_SECONDS``; the source's
real path and a symlink's target at most ``MAX_PATH_BYTES`` characters (the kernel's
PATH_MAX, less the NUL); a path inside a tree (walked by descriptor, so it may be longer
than PATH_MAX) at most ``MAX_TREE_PATH``; a directive, an item's source and dest at most
``MAX_TEXT``; a checksum 64 lowercase hex digits; at most ``MAX_FDS`` paths in a batch (a
message's descriptors) and ``MAX_PROBLEMS`` problems of ``MAX_PROBLEM`` characters in an
item. A manifest's number of entries is bounded by the channel's message size (256 MiB).
Strings are counted in characters: a file name's undecodable bytes arrive as one
surrogate each, so a name of N bytes is never more than N characters.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol, Self, TypeVar

from wrapper.fastdataclass import (
    dataclass,  # a dozen records: no generated code (see wrapper.fastdataclass)
)
from wrapper.staging.channel import MAX_FDS, close_fds
from wrapper.staging.errors import StagingError
from wrapper.staging.report import Progress, StageItem
from wrapper.staging.spec import MAX_PATH_BYTES
from wrapper.staging.tree import DIR, FILE, LINK, Entry, Manifest, is_inner_path

WORKER = "the staging worker"  # who sent it, for the error: root reads the worker's word
HOOK = "the hook"  # and the worker reads root's

MAX_DIRECTIVES = 10_000
MAX_COUNT = (1 << 63) - 1
MAX_TIME_NS = (1 << 63) * 1_000_000_000 - 1
MAX_SECONDS = 1e8  # about three years
MAX_TREE_PATH = 1 << 17
MAX_TEXT = 16_384  # "--stage-out=" and two paths of PATH_MAX, with room to spare
MAX_PROBLEMS = 1_000  # stage-out lists 50 at most
MAX_PROBLEM = 65_536
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SHOWN = 40  # characters of a sent value quoted in an error


class MessageError(StagingError):
    """A staging message that is not one this version sends (its kind, a field's type
    or bounds, missing or extra fields, or not an object at all)."""


class _Bad(Exception):
    """A field that is wrong; ``decode`` says in which message."""


REGISTRY: dict[str, type[Message]] = {}
M = TypeVar("M", bound="Message")


def kind(name: str) -> Callable[[type[M]], type[M]]:
    """Register a message class under ``name`` (its ``"t"`` value)."""

    def register(cls: type[M]) -> type[M]:
        if name in REGISTRY:
            raise ValueError(f"message kind {name!r} registered twice")
        cls.KIND = name
        REGISTRY[name] = cls
        return cls

    return register


@dataclass(frozen=True)
class Message:
    """A kind without fields; a kind with fields says them in ``FIELDS``, writes them in
    ``fields`` and reads them, checked, in ``read``."""

    KIND: ClassVar[str] = ""
    FIELDS: ClassVar[tuple[str, ...]] = ()

    def fields(self) -> dict[str, Any]:
        return {}

    @classmethod
    def read(cls, data: dict[str, Any]) -> Self:
        return cls()


@kind("cache")
@dataclass(frozen=True)
class CacheAsk(Message):
    """Worker: may the cache serve directive ``index``? (+ the source's descriptor)"""

    FIELDS: ClassVar[tuple[str, ...]] = ("index", "manifest", "scan_seconds")
    index: int
    manifest: Manifest
    scan_seconds: float

    def fields(self) -> dict[str, Any]:
        return {"index": self.index, "manifest": self.manifest.to_wire(),
                "scan_seconds": self.scan_seconds}

    @classmethod
    def read(cls, data: dict[str, Any]) -> Self:
        return cls(index=_whole(data["index"], "index", MAX_DIRECTIVES - 1),
                   manifest=_manifest(data["manifest"]),
                   scan_seconds=_seconds(data["scan_seconds"], "scan_seconds"))


@kind("send")
@dataclass(frozen=True)
class Send(Message):
    """Root: a miss; send every file's descriptor (``Fds`` batches, then ``FdsEnd``)."""


@kind("direct")
@dataclass(frozen=True)
class Direct(Message):
    """Root: the cache cannot take it; copy (or unpack) it into scratch yourself."""


@kind("fds")
@dataclass(frozen=True)
class Fds(Message):
    """Worker: one batch of one folder's files, a descriptor per path riding along."""

    FIELDS: ClassVar[tuple[str, ...]] = ("paths",)
    paths: tuple[str, ...]

    def fields(self) -> dict[str, Any]:
        return {"paths": list(self.paths)}

    @classmethod
    def read(cls, data: dict[str, Any]) -> Self:
        paths = _list(data["paths"], "paths", MAX_FDS)
        return cls(paths=tuple(_tree_path(p, f"paths[{i}]") for i, p in enumerate(paths)))


@kind("fds-end")
@dataclass(frozen=True)
class FdsEnd(Message):
    """Worker: every file's descriptor has been sent."""


@kind("more")
@dataclass(frozen=True)
class More(Message):
    """Root: the batch arrived; send the next."""


@kind("placed")
@dataclass(frozen=True)
class Placed(Message):
    """Root: the dataset is in scratch (root placed it from the cache)."""


@kind("unpack")
@dataclass(frozen=True)
class Unpack(Message):
    """Root: unpack the cached archive (its descriptor rides along) into scratch."""

    FIELDS: ClassVar[tuple[str, ...]] = ("hit", "wait")
    hit: bool
    wait: float

    def fields(self) -> dict[str, Any]:
        return {"hit": self.hit, "wait": self.wait}

    @classmethod
    def read(cls, data: dict[str, Any]) -> Self:
        return cls(hit=_flag(data["hit"], "hit"), wait=_seconds(data["wait"], "wait"))


@kind("progress")
@dataclass(frozen=True)
class ProgressNote(Message):
    """Worker: how far a directive has got."""

    FIELDS: ClassVar[tuple[str, ...]] = ("p",)
    progress: Progress

    def fields(self) -> dict[str, Any]:
        return {"p": self.progress.as_dict()}

    @classmethod
    def read(cls, data: dict[str, Any]) -> Self:
        return cls(progress=_progress(data["p"]))


@kind("item")
@dataclass(frozen=True)
class ItemDone(Message):
    """Worker: what a directive it staged itself did."""

    FIELDS: ClassVar[tuple[str, ...]] = ("item",)
    item: StageItem

    def fields(self) -> dict[str, Any]:
        return {"item": self.item.as_dict()}

    @classmethod
    def read(cls, data: dict[str, Any]) -> Self:
        return cls(item=_item(data["item"]))


@kind("end")
@dataclass(frozen=True)
class End(Message):
    """Worker: every directive is done."""


def encode(message: Message) -> dict[str, Any]:
    """The JSON object ``message`` crosses as."""
    return {"t": message.KIND, **message.fields()}


def decode(data: object, *, sender: str = WORKER) -> Message:
    """The message ``data`` (a decoded JSON value) is; raises MessageError for anything
    else, and never another error."""
    if not isinstance(data, dict):
        raise MessageError(f"{sender} sent a malformed message (not an object)")
    name = data.get("t")
    cls = REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None:
        raise MessageError(f"{sender} sent a message of unknown kind {_shown(name)}")
    try:
        return cls.read(_exactly(data, ("t", *cls.FIELDS), "the message"))
    except _Bad as exc:
        raise MessageError(f"{sender} sent a bad {cls.KIND!r} message: {exc}") from None


class Endpoint(Protocol):
    """Either end of the socketpair: a ``Channel``, or root's ``Worker``."""

    def send(self, message: dict[str, Any], fds: Sequence[int] = ()) -> None: ...

    def recv(self) -> tuple[dict[str, Any], list[int]]: ...


def send(end: Endpoint, message: Message, fds: Sequence[int] = ()) -> None:
    end.send(encode(message), fds)


def receive(end: Endpoint, *, sender: str = WORKER) -> tuple[Message, list[int]]:
    """The next message, decoded, and the descriptors it carried (the caller's to
    close; closed here when the message is refused)."""
    data, fds = end.recv()
    try:
        return decode(data, sender=sender), fds
    except MessageError:
        close_fds(fds)
        raise


# -- the nested records ---------------------------------------------------------------------

_PROGRESS = ("directive", "files_done", "files_total", "bytes_done", "bytes_total",
             "seconds", "done", "rate")
_ITEM = ("direction", "directive", "source", "dest", "files", "bytes", "seconds",
         "cache_hit", "cache_wait", "unpacked", "missing", "problems", "checksums",
         "cache_key")


def _progress(value: object) -> Progress:
    data = _exactly(value, _PROGRESS, "p")
    if not isinstance(data["rate"], int | float) or isinstance(data["rate"], bool) \
            or not 0 <= data["rate"] < math.inf:
        raise _Bad("p.rate is not a finite number from 0")  # derived: not kept
    return Progress(directive=_text(data["directive"], "p.directive", MAX_TEXT),
                    files_done=_whole(data["files_done"], "p.files_done"),
                    files_total=_whole(data["files_total"], "p.files_total"),
                    bytes_done=_whole(data["bytes_done"], "p.bytes_done"),
                    bytes_total=_whole(data["bytes_total"], "p.bytes_total"),
                    seconds=_seconds(data["seconds"], "p.seconds"),
                    done=_flag(data["done"], "p.done"))


def _item(value: object) -> StageItem:
    data = _exactly(value, _ITEM, "item")
    if data["direction"] not in ("in", "out"):
        raise _Bad("item.direction is not 'in' or 'out'")
    hit = data["cache_hit"]
    problems = _list(data["problems"], "item.problems", MAX_PROBLEMS)
    checksums = data["checksums"]
    if not isinstance(checksums, dict):
        raise _Bad("item.checksums is not an object")
    _text(data["cache_key"], "item.cache_key", 64)  # root's alone: the worker's is dropped
    return StageItem(
        direction=data["direction"], directive=_text(data["directive"], "item.directive",
                                                     MAX_TEXT),
        source=_text(data["source"], "item.source", MAX_TEXT),
        dest=_text(data["dest"], "item.dest", MAX_TEXT),
        files=_whole(data["files"], "item.files"), bytes=_whole(data["bytes"], "item.bytes"),
        seconds=_seconds(data["seconds"], "item.seconds"),
        cache_hit=None if hit is None else _flag(hit, "item.cache_hit"),
        cache_wait=_seconds(data["cache_wait"], "item.cache_wait"),
        unpacked=_flag(data["unpacked"], "item.unpacked"),
        missing=_flag(data["missing"], "item.missing"),
        problems=tuple(_text(p, "item.problems[]", MAX_PROBLEM) for p in problems),
        checksums={_text(k, "item.checksums' path", MAX_TREE_PATH):
                   _digest(v, "item.checksums' value") for k, v in checksums.items()})


def _manifest(value: object) -> Manifest:
    data = _exactly(value, ("source", "kind", "entries"), "manifest")
    if data["kind"] not in (FILE, DIR):
        raise _Bad("manifest.kind is not 'file' or 'dir'")
    rows = data["entries"]
    if not isinstance(rows, list) or not rows:
        raise _Bad("manifest.entries is not a list of entries")
    manifest = Manifest(source=_text(data["source"], "manifest.source", MAX_PATH_BYTES),
                        kind=data["kind"], entries=tuple(_entry(r) for r in rows))
    entries = manifest.entries
    if entries[0].path != "" or entries[0].kind != manifest.kind \
            or any(e.path == "" for e in entries[1:]) \
            or len({e.path for e in entries}) != len(entries):
        raise _Bad("the manifest is inconsistent (its root first, every path once)")
    return manifest


def _entry(row: object) -> Entry:
    if not isinstance(row, list) or len(row) != 8:
        raise _Bad("a manifest entry is not a list of 8 values")
    path, entry_kind, size, mode, mtime_ns, ctime_ns, target, sha256 = row
    if entry_kind not in (FILE, DIR, LINK):
        raise _Bad("a manifest entry's kind is not 'file', 'dir' or 'symlink'")
    digest = _text(sha256, "a manifest entry's sha256", 64)
    return Entry(path=_tree_path(path, "a manifest entry's path"), kind=entry_kind,
                 size=_whole(size, "a manifest entry's size"),
                 mode=_whole(mode, "a manifest entry's mode") & 0o7777,
                 mtime_ns=_whole(mtime_ns, "a manifest entry's mtime", MAX_TIME_NS),
                 ctime_ns=_whole(ctime_ns, "a manifest entry's ctime", MAX_TIME_NS),
                 target=_text(target, "a manifest entry's target", MAX_PATH_BYTES),
                 sha256=digest and _digest(digest, "a manifest entry's sha256"))


# -- bounded readers of one value -----------------------------------------------------------


def _exactly(value: object, names: Sequence[str], what: str) -> dict[str, Any]:
    """``value`` as an object with exactly the fields ``names``."""
    if not isinstance(value, dict):
        raise _Bad(f"{what} is not an object")
    missing = [n for n in names if n not in value]
    if missing:
        raise _Bad(f"{what} lacks {', '.join(missing)}")
    extra = next((k for k in value if k not in names), None)
    if extra is not None:
        raise _Bad(f"{what} has the unknown field {_shown(extra)}")
    return value


def _whole(value: object, what: str, high: int = MAX_COUNT) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= high:
        raise _Bad(f"{what} is not a whole number from 0 to {high}")
    return value


def _seconds(value: object, what: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) \
            or not 0 <= value <= MAX_SECONDS:  # NaN compares false: refused too
        raise _Bad(f"{what} is not a number of seconds from 0 to {MAX_SECONDS:.0f}")
    return float(value)


def _flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise _Bad(f"{what} is not true or false")
    return value


def _text(value: object, what: str, limit: int) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise _Bad(f"{what} is not a string of at most {limit} characters")
    return value


def _tree_path(value: object, what: str) -> str:
    """A path inside a tree ("" is its root) that cannot leave it."""
    path = _text(value, what, MAX_TREE_PATH)
    if path and not is_inner_path(path):
        raise _Bad(f"{what} {_shown(path)} is not a path inside the tree")
    return path


def _digest(value: object, what: str) -> str:
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise _Bad(f"{what} is not a sha256 (64 lowercase hex digits)")
    return value


def _list(value: object, what: str, limit: int) -> list[Any]:
    if not isinstance(value, list) or len(value) > limit:
        raise _Bad(f"{what} is not a list of at most {limit} values")
    return value


def _shown(value: object) -> str:
    """A sent value as an error may quote it: a string's first characters, else its type."""
    if isinstance(value, str):
        return repr(value[:_SHOWN]) + ("..." if len(value) > _SHOWN else "")
    return "null" if value is None else f"(a JSON {type(value).__name__})"
