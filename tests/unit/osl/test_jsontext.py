"""Any text a user could write decodes to a value or to None, never an exception (issue 22,
item 2): bounded length and nesting, no NaN, no huge numbers, invalid UTF-8 dropped."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wrapper.errors import JobwrapError
from wrapper.job import events as ev
from wrapper.job.state import JobState
from wrapper.osl import jsontext

HOSTILE = [
    b"[" * 100_000,
    b"{\"a\":" * 50_000 + b"1" + b"}" * 50_000,
    b"[" * 33 + b"]" * 33,                      # one past the bound, well-formed
    b"{\"ts\": NaN, \"event\": \"hang\"}",
    b"{\"ts\": Infinity}",
    b"{\"ts\": 1e999}",
    b"{\"attempt\": " + b"9" * 5000 + b"}",
    b"{\"attempt\": " + b"9" * 301 + b"}",
    b"{\"event\": \"hang\", \"x\": \"\xff\xfe\"}",
    b"{\"event\": \"" + b"a" * (1 << 20) + b"\"}",
    b"\x00\x01\x02",
    b"",
]


@pytest.mark.parametrize("data", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_texts_are_none(data: bytes) -> None:
    assert jsontext.loads(data) is None


def test_ordinary_texts_decode() -> None:
    assert jsontext.loads(b'{"a": [1, 2.5, {"b": null}], "c": "\\u00e9"}') == \
        {"a": [1, 2.5, {"b": None}], "c": "é"}
    assert jsontext.loads("[" * 32 + "]" * 32) is not None
    assert jsontext.loads_object(b"[1]") is None
    assert jsontext.loads(b'{"n": -123456789012345678901234567890}') == \
        {"n": -123456789012345678901234567890}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_any_bytes_never_raise(data: bytes) -> None:
    value = jsontext.loads(data)
    if isinstance(value, dict):
        ev.decode(value)  # nor does the typed decoder of what it returns


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_value_decodes_or_is_dropped(value: object) -> None:
    """A bounded JSON text reads back as the value it was written from, or, holding a
    non-finite float (json.dumps writes NaN/Infinity, which JSON has not), as None; an
    object of it is decoded as an event or refused with the decoder's own error."""
    text = json.dumps(value)
    out = jsontext.loads(text)
    if _has_nonfinite(value):
        assert out is None, (text, out)
    else:
        assert out == value, (text, out)
    if isinstance(out, dict):
        try:
            event = ev.decode({**out, "event": "hang"})
        except JobwrapError:
            return
        assert event.KIND == "hang"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=300), st.sampled_from(HOSTILE[:9])),
                max_size=8))
def test_the_event_reader_survives_any_user_file(tmp_path_factory: pytest.TempPathFactory,
                                                lines: list[bytes]) -> None:
    state = JobState(tmp_path_factory.mktemp("state"), "42")
    os.makedirs(state.path)
    good = b'{"ts": 1.0, "event": "checkpoint", "attempt": 0, "path": "a"}'
    (state.path / "user-events.jsonl").write_bytes(b"\n".join([*lines, good]) + b"\n")
    events = state.events()
    assert {"ts": 1.0, "event": "checkpoint", "attempt": 0, "path": "a",
            "source": "user"} in events
    for record in events:
        ev.decode(record)


def test_a_poisoned_line_costs_only_itself(tmp_path: Path) -> None:
    state = JobState(tmp_path, "7")
    os.makedirs(state.path)
    (state.path / "user-events.jsonl").write_bytes(
        b"[" * 100_000 + b"\n" + b'{"ts": 2, "event": "checkpoint", "attempt": 0}\n')
    assert [e["event"] for e in state.events()] == ["checkpoint"]


def _has_nonfinite(value: object) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_nonfinite(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_nonfinite(v) for v in value)
    return False
