"""The staging messages: every kind round-trips, and the one decoder refuses, with its own
error and a clear message, anything a worker (the job's user) could send instead."""

from __future__ import annotations

import copy
import json
import os
import socket
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wrapper.osl import jsontext
from wrapper.staging.channel import MAX_FDS, Channel
from wrapper.staging.errors import StagingError
from wrapper.staging.messages import (
    HOOK,
    MAX_COUNT,
    MAX_DIRECTIVES,
    MAX_PROBLEMS,
    MAX_SECONDS,
    MAX_TEXT,
    MAX_TIME_NS,
    MAX_TREE_PATH,
    REGISTRY,
    CacheAsk,
    Direct,
    End,
    Fds,
    FdsEnd,
    ItemDone,
    Message,
    MessageError,
    More,
    Placed,
    ProgressNote,
    Send,
    Unpack,
    decode,
    encode,
    receive,
    send,
)
from wrapper.staging.report import Progress, StageItem
from wrapper.staging.server import Server
from wrapper.staging.settings import StageSettings
from wrapper.staging.spec import MAX_PATH_BYTES, StageIn
from wrapper.staging.tree import Entry, Manifest

SUM = "ab" * 32
MANIFEST = Manifest("/shared/ds", "dir", (
    Entry("", "dir", mode=0o755, mtime_ns=1, ctime_ns=2),
    Entry("a", "file", size=3, mode=0o644, mtime_ns=5, ctime_ns=6, sha256=SUM),
    Entry("a\udcff", "file", size=0),  # a name that is not UTF-8: one surrogate per byte
    Entry("sub", "dir"),
    Entry("sub/link", "symlink", target="../a")))
PROGRESS = Progress(directive="--stage-in=/shared/ds:data", files_done=1, files_total=2,
                    bytes_done=3, bytes_total=4, seconds=0.5, done=False)
ITEM = StageItem(direction="in", directive="--stage-in=/shared/ds:data", source="/shared/ds",
                 dest="data", files=2, bytes=3, seconds=1.25, cache_hit=None,
                 cache_wait=0.0, unpacked=True, checksums={"data/a": SUM})
EXAMPLES: list[Message] = [
    CacheAsk(index=3, manifest=MANIFEST, scan_seconds=0.25), Send(), Direct(),
    Fds(paths=("a", "sub/b")), FdsEnd(), More(), Placed(), Unpack(hit=True, wait=1.5),
    ProgressNote(PROGRESS),
    ItemDone(StageItem(direction="out", directive="--stage-out=r:/d", source="r",
                       dest="/d", missing=True, problems=("r: gone",))),
    ItemDone(ITEM), End()]


def wire(message: Message) -> Any:
    """What the other end decodes: the JSON text, read back as the channel reads it."""
    return jsontext.loads(json.dumps(encode(message)).encode(), max_bytes=1 << 28)


def test_every_kind_has_an_example() -> None:
    assert {type(m).KIND for m in EXAMPLES} == set(REGISTRY)
    assert len(REGISTRY) == 11


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_kind_round_trips(message: Message) -> None:
    assert decode(wire(message)) == message
    assert encode(message)["t"] == type(message).KIND


def test_roots_word_on_the_cache_key_is_roots_alone() -> None:
    """An item from the worker never carries a cache key to root (root sets its own)."""
    data = wire(ItemDone(ITEM))
    data["item"]["cache_key"] = "f" * 64
    decoded = decode(data)
    assert isinstance(decoded, ItemDone) and decoded.item.cache_key == ""


def valid(kind: str) -> dict[str, Any]:
    message = next(m for m in EXAMPLES if kind == type(m).KIND)
    data = wire(message)
    assert isinstance(data, dict)
    return data


def changed(kind: str, path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """The example of ``kind`` with the value at ``path`` replaced (or removed: DROP)."""
    data = copy.deepcopy(valid(kind))
    here: Any = data
    for step in path[:-1]:
        here = here[step]
    if value is DROP:
        del here[path[-1]]
    else:
        here[path[-1]] = value
    return data


DROP = object()
ENTRY = ("manifest", "entries", 1)
BAD: list[tuple[str, object, str]] = [
    # not a message at all
    ("a list", ["t", "end"], "malformed message"),
    ("a string", "end", "malformed message"),
    ("null", None, "malformed message"),
    ("a number", 7, "malformed message"),
    ("no kind", {"index": 1}, "unknown kind null"),
    ("a kind that is no string", {"t": 1}, r"unknown kind \(a JSON int\)"),
    ("an unknown kind", {"t": "error"}, "unknown kind 'error'"),
    ("a kind with a space", {"t": "fds-end ", "paths": []}, "unknown kind 'fds-end '"),
    # the fields
    ("an extra field", {"t": "end", "x": 1}, "the message has the unknown field 'x'"),
    ("a missing field", changed("unpack", ("wait",), DROP), "the message lacks wait"),
    ("a field of a fieldless kind", {"t": "placed", "hit": True}, "unknown field 'hit'"),
    ("an index that is text", changed("cache", ("index",), "3"), "index is not a whole"),
    ("an index that is a bool", changed("cache", ("index",), True), "index is not a whole"),
    ("a negative index", changed("cache", ("index",), -1), "index is not a whole"),
    ("a huge index", changed("cache", ("index",), MAX_DIRECTIVES), "index is not a whole"),
    ("negative seconds", changed("cache", ("scan_seconds",), -0.5), "scan_seconds is not"),
    ("NaN seconds", changed("cache", ("scan_seconds",), float("nan")), "scan_seconds is not"),
    ("endless seconds", changed("unpack", ("wait",), MAX_SECONDS * 2), "wait is not a number"),
    ("a hit that is 1", changed("unpack", ("hit",), 1), "hit is not true or false"),
    # the manifest
    ("a manifest that is a list", changed("cache", ("manifest",), []), "manifest is not an"),
    ("a manifest of another kind", changed("cache", ("manifest", "kind"), "symlink"),
     "manifest.kind"),
    ("a manifest without entries", changed("cache", ("manifest", "entries"), []),
     "manifest.entries"),
    ("a manifest's extra field", changed("cache", ("manifest", "x"), 1), "manifest has the"),
    ("an oversized source", changed("cache", ("manifest", "source"),
                                    "/" + "s" * MAX_PATH_BYTES), "manifest.source is not a"),
    ("a short entry", changed("cache", ENTRY, ["a", "file", 3]), "not a list of 8 values"),
    ("an entry of a fifo", changed("cache", (*ENTRY, 1), "fifo"), "kind is not 'file'"),
    ("an escaping path", changed("cache", (*ENTRY, 0), "../etc/shadow"),
     "path '../etc/shadow' is not a path inside"),
    ("an absolute path", changed("cache", (*ENTRY, 0), "/etc"), "not a path inside"),
    ("a lone surrogate", changed("cache", (*ENTRY, 0), "\ud800"), "not a path inside"),
    ("an oversized path", changed("cache", (*ENTRY, 0), "a/" * MAX_TREE_PATH),
     "path is not a string of at most"),
    ("a negative size", changed("cache", (*ENTRY, 2), -1), "size is not a whole number"),
    ("a size past off_t", changed("cache", (*ENTRY, 2), MAX_COUNT + 1), "size is not"),
    ("a time past time_t", changed("cache", (*ENTRY, 4), MAX_TIME_NS + 1), "mtime is not"),
    ("a size that is a float", changed("cache", (*ENTRY, 2), 3.0), "size is not"),
    ("an oversized target", changed("cache", (*ENTRY, 6), "t" * (MAX_PATH_BYTES + 1)),
     "target is not a string"),
    ("a checksum that is no sha256", changed("cache", (*ENTRY, 7), "ABC"), "sha256 is not"),
    ("two roots", changed("cache", (*ENTRY, 0), ""), "inconsistent"),
    ("a path twice", changed("cache", ("manifest", "entries", 2, 0), "a"), "inconsistent"),
    ("the root not first", changed("cache", ("manifest", "entries", 0, 0), "z"),
     "inconsistent"),
    # a batch
    ("paths that are no list", changed("fds", ("paths",), "a"), "paths is not a list"),
    ("more paths than descriptors fit", changed("fds", ("paths",), ["a"] * (MAX_FDS + 1)),
     "paths is not a list of at most 200"),
    ("a path that is a number", changed("fds", ("paths", 0), 7), r"paths\[0\] is not a str"),
    ("an escaping batch path", changed("fds", ("paths", 1), "a/../../b"),
     r"paths\[1\] 'a/../../b' is not a path"),
    # progress and items
    ("progress without its rate", changed("progress", ("p", "rate"), DROP), "p lacks rate"),
    ("progress of endless rate", changed("progress", ("p", "rate"), float("inf")), "p.rate"),
    ("progress that is text", changed("progress", ("p",), "50%"), "p is not an object"),
    ("a negative count", changed("progress", ("p", "files_done"), -3), "p.files_done"),
    ("an oversized directive", changed("progress", ("p", "directive"), "d" * (MAX_TEXT + 1)),
     "p.directive is not a string of at most"),
    ("a sideways item", changed("item", ("item", "direction"), "up"), "item.direction"),
    ("a hit that is text", changed("item", ("item", "cache_hit"), "yes"), "item.cache_hit"),
    ("problems that are no list", changed("item", ("item", "problems"), "x"),
     "item.problems is not a list"),
    ("too many problems", changed("item", ("item", "problems"), ["x"] * (MAX_PROBLEMS + 1)),
     "item.problems is not a list of at most"),
    ("a problem that is a number", changed("item", ("item", "problems"), [1]),
     r"item.problems\[\] is not a string"),
    ("checksums that are a list", changed("item", ("item", "checksums"), []),
     "item.checksums is not an object"),
    ("a checksum that is no sha256", changed("item", ("item", "checksums", "data/a"), "x"),
     "item.checksums' value is not a sha256"),
    ("an item's extra field", changed("item", ("item", "uid"), 0), "item has the unknown"),
]


@pytest.mark.parametrize(("data", "error"), [(d, e) for _, d, e in BAD],
                         ids=[name for name, _, _ in BAD])
def test_the_decoder_refuses_what_no_sender_writes(data: object, error: str) -> None:
    with pytest.raises(MessageError, match=error) as caught:
        decode(data)
    text = str(caught.value)
    assert text.startswith("the staging worker sent ") and len(text) < 300, text
    assert isinstance(caught.value, StagingError)  # the stage fails; root's hook does not


def test_the_error_names_the_kind_and_the_sender() -> None:
    with pytest.raises(MessageError, match=r"^the hook sent a bad 'unpack' message: "
                                           r"hit is not true or false$"):
        decode(changed("unpack", ("hit",), None), sender=HOOK)


def test_an_oversized_kind_is_quoted_short() -> None:
    with pytest.raises(MessageError) as caught:
        decode({"t": "x" * 100_000})
    assert len(str(caught.value)) < 120


# paths that try to leave, names no file system has (a JSON "\ud800" decodes to a lone
# surrogate), and values of every other type and range
HOSTILE: list[Any] = [
    "", "a", "a/b", ".", "..", "../x", "a/../b", "/", "/etc", "a//b", "\x00", "\ud800",
    "a\udcff", "x" * 256, "y" * (MAX_TREE_PATH + 1), SUM, None, True, False, 0, -1, 2**63,
    10**300, 1.5, -0.0, float("nan"), float("inf"), [], ["a"], {}, {"t": "end"}]
texts = st.sampled_from([h for h in HOSTILE if isinstance(h, str)]) | st.text(
    st.characters(exclude_categories=()))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=30)


def _decodes_or_refuses(data: object) -> None:
    try:
        message = decode(data)
    except MessageError:
        return
    assert isinstance(message, Message)
    assert decode(wire(message)) == message  # what decodes, encodes back to itself


@settings(max_examples=500, deadline=None)
@given(json_values)
def test_any_json_value_decodes_or_is_refused_with_the_one_error(value: object) -> None:
    _decodes_or_refuses(value)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(sorted(REGISTRY)), st.data())
def test_any_fields_of_a_known_kind_decode_or_are_refused(kind: str,
                                                          data: st.DataObject) -> None:
    """Objects of a real kind with its own field names, holding anything."""
    names = REGISTRY[kind].FIELDS
    fields = data.draw(st.fixed_dictionaries({n: json_values for n in names}))
    _decodes_or_refuses({"t": kind, **fields})


def _places(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place inside a JSON value (the paths of its nested members)."""
    out = [path]
    if isinstance(value, dict):
        for key, member in value.items():
            out.extend(_places(member, (*path, key)))
    elif isinstance(value, list):
        for i, member in enumerate(value):
            out.extend(_places(member, (*path, i)))
    return out


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(EXAMPLES), st.data())
def test_a_real_message_with_one_value_swapped_decodes_or_is_refused(
        message: Message, data: st.DataObject) -> None:
    """Deep inside: any one member of a real message replaced by any JSON value."""
    sent = wire(message)
    path = data.draw(st.sampled_from(_places(sent)[1:] or [("t",)]))
    _decodes_or_refuses(changed_at(sent, path, data.draw(json_values)))


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_place_of_every_kind_takes_any_hostile_value(message: Message) -> None:
    """Each member of each real message, swapped for each hostile value in turn."""
    sent = wire(message)
    for path in _places(sent)[1:]:
        for value in HOSTILE:
            _decodes_or_refuses(changed_at(sent, path, value))


def changed_at(data: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(data)
    here: Any = out
    for step in path[:-1]:
        here = here[step]
    here[path[-1]] = value
    return out


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_refused_message_has_its_descriptors_closed() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sender, receiver = Channel(left), Channel(right)
    before = _open_fds()
    extra = os.open("/", os.O_RDONLY)
    sender.send({"t": "fds", "paths": ["../x"]}, [extra])
    os.close(extra)
    with pytest.raises(MessageError, match="not a path inside"):
        receive(receiver)
    assert _open_fds() == before
    extra = os.open("/", os.O_RDONLY)
    send(sender, Fds(paths=("x",)), [extra])
    os.close(extra)
    message, fds = receive(receiver)
    assert message == Fds(paths=("x",)) and len(fds) == 1
    os.close(fds[0])
    left.close()
    right.close()


class Scripted:
    """Root's end of a worker that says what the test scripted (and records the answers)."""

    def __init__(self, *messages: dict[str, Any]) -> None:
        self.messages = list(messages)
        self.answers: list[dict[str, Any]] = []

    def recv(self) -> tuple[dict[str, Any], list[int]]:
        return self.messages.pop(0), []

    def send(self, message: dict[str, Any], fds: Any = ()) -> None:
        self.answers.append(message)


def serve(worker: Scripted, specs: list[StageIn] | None = None) -> list[StageItem]:
    seen: list[Progress] = []
    server = Server(worker, specs or [], cache=None, scratch_fd=-1, user=None,
                    settings=StageSettings(), report=seen.append, deadline=None)
    items = server.run()
    assert seen == [PROGRESS] * len(seen)
    return items


def test_root_gathers_the_workers_items_until_it_ends() -> None:
    worker = Scripted(encode(ProgressNote(PROGRESS)), encode(ItemDone(ITEM)), encode(End()))
    assert serve(worker) == [ITEM]
    assert worker.answers == []


@pytest.mark.parametrize(("message", "error"), [
    (encode(Send()), "the staging worker sent an unexpected 'send'"),
    (encode(CacheAsk(0, MANIFEST, 0.0)), "unexpected 'cache'"),  # there is no cache
    ({"t": "item", "item": {}}, "the staging worker sent a bad 'item' message: item lacks"),
])
def test_root_refuses_a_message_out_of_turn_or_malformed(message: dict[str, Any],
                                                          error: str) -> None:
    with pytest.raises(StagingError, match=error):
        serve(Scripted(message, encode(End())))
