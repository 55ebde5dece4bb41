"""Property-based fuzzing of #JOBWRAP directives and script bytes (issue 12, items 1, 7).

Whatever a user writes in a batch script, wrapper/submit/directives.py gives options within
their ranges or a UserInputError with a message: never another exception (a traceback
in a root hook). job_submit.lua, under a real Lua, gives the same verdict and message.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.lua import luarun
from tests.support.submit import lua_verdicts, python_verdict
from wrapper.errors import UserInputError
from wrapper.submit.directives import (
    HEADER_BYTES,
    MAX_HANG_TIMEOUT,
    MAX_RESTARTS,
    OPTIONS,
    JobOptions,
    parse_script,
)

FUZZ = settings(deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Pieces of hostile values: huge numbers, Unicode digits and blanks, bytes that are
# not UTF-8 (as the hooks decode them: lone surrogates), quotes, escapes.
_NUMBERS = st.one_of(
    st.integers(min_value=0, max_value=10**12).map(str),
    st.integers(min_value=1, max_value=5000).map(lambda n: "9" * n),
    st.sampled_from(["-1", "+1", "1_0", "1__0", "0x10", "1e3", "\u00b2", "\u0663", "\uff11",
                     "1.5", ""]),
)
_DURATIONS = st.one_of(
    _NUMBERS,
    st.builds(lambda n, u: f"{n}{u}", _NUMBERS, st.sampled_from("dhmsDHMx")),
    st.builds(lambda d, h, m, s: f"{d}-{h}:{m}:{s}", _NUMBERS, _NUMBERS, _NUMBERS, _NUMBERS),
    st.builds(lambda h, m: f"{h}:{m}", _NUMBERS, _NUMBERS),
)
_ODD = st.sampled_from(["\udce9", "\udcff\udcfe", "é", "€", "\xa0", "\u2003", "\x00", "\t",
                        "'", '"', "\\", " ", "\x1f", "\x0b", "\r", "$", "~", "/", ":", ".."])
_VALUES = st.one_of(_NUMBERS, _DURATIONS, st.text(max_size=40),
                    st.lists(st.one_of(_ODD, st.text(max_size=5)), max_size=8).map("".join))
_NAMES = st.one_of(st.sampled_from([o.name for o in OPTIONS]),
                   st.sampled_from(["--bogus", "-x", "--", "=", "--max_restarts"]),
                   st.text(max_size=10))


@st.composite
def _directive_line(draw: st.DrawFn) -> str:
    words = []
    for _ in range(draw(st.integers(0, 3))):
        name, value = draw(_NAMES), draw(_VALUES)
        quote = draw(st.sampled_from(["", "", "'", '"']))
        form = draw(st.integers(0, 2))
        words.append(name if form == 0 else f"{name}={quote}{value}{quote}" if form == 1
                     else f"{name} {quote}{value}{quote}")
    blanks = draw(st.sampled_from([" ", "\t", "  \t ", " " * 5000]))
    return "#JOBWRAP" + blanks + blanks.join(words) + draw(st.sampled_from(["", " ", "\t"]))


def _script(lines: list[str]) -> str:
    return "#!/bin/bash\n" + "\n".join(lines) + "\nsrun python train.py\n"


def _clean(script: str) -> JobOptions | str:
    try:
        options = parse_script(script)
    except UserInputError as exc:
        message = str(exc)
        assert message.startswith("#JOBWRAP line "), message
        return message
    if options.max_restarts is not None:
        assert 0 <= options.max_restarts <= MAX_RESTARTS
    if options.hang_timeout is not None:
        assert 0 <= options.hang_timeout <= MAX_HANG_TIMEOUT  # 0: off
    return options


@FUZZ
@given(st.lists(st.one_of(_directive_line(), st.sampled_from(["", "#SBATCH -N1", "# c"])),
                max_size=6))
def test_directive_lines_give_options_or_a_message(lines: list[str]) -> None:
    _clean(_script(lines))


@FUZZ
@given(st.text())
def test_any_text_gives_options_or_a_message(text: str) -> None:
    _clean(text)
    _clean("#!/bin/bash\n#JOBWRAP " + text)


@FUZZ
@given(st.binary())
def test_any_script_bytes_give_options_or_a_message(data: bytes) -> None:
    # As the hooks read a script from scontrol: bytes that are not UTF-8 never raise.
    _clean(data.decode("utf-8", "surrogateescape"))
    _clean(b"#!/bin/bash\n#JOBWRAP --checkpoint-dir=".join([b"", data])
           .decode("utf-8", "surrogateescape"))


@FUZZ
@given(st.integers(min_value=0, max_value=3 * HEADER_BYTES), st.sampled_from(" \t#x"))
def test_long_headers_give_options_or_a_message(size: int, filler: str) -> None:
    _clean("#!/bin/bash\n#" + filler * size + "\n#JOBWRAP --max-restarts=" + "9" * size)


# -- agreement with the real job_submit.lua ------------------------------------------
# Bytes whose Python repr() job_submit.lua reproduces: ASCII, printable UTF-8, the C1
# controls, and bytes that are not UTF-8 (truncated, overlong, surrogates, 0xFF).
_BYTE_PIECES = st.sampled_from([
    b"\xe9", b"\xc3\xa9", b"\xe2\x82\xac", b"\xc2\xa0", b"\xc2\xad", b"\xc2\x85",
    b"\xf0\x9f\x98\x80", b"\xe2\x82", b"\xed\xa0\x80", b"\xc0\xaf", b"\xff", b"\xf4\x90\x80\x80",
    b"'", b'"', b"\\", b" ", b"\t", b"\x0b", b"\x1f", b"\r", b"\r\n", b"\n", b"=", b":", b"/",
    b"--", b"#", b"#JOBWRAP ", b"#SBATCH --no-requeue", b"\x00"])
_LINE_BYTES = st.one_of(
    _directive_line().map(lambda s: s.encode("utf-8", "surrogateescape")),
    st.lists(st.one_of(_BYTE_PIECES, st.binary(max_size=4).filter(bytes.isascii)),
             max_size=12).map(lambda parts: b"#JOBWRAP " + b"".join(parts)),
)


def _lua_safe(line: bytes) -> bool:
    """Lines whose every character job_submit.lua quotes as Python does (no exotic
    non-printable Unicode, which Lua does not know, from generated text)."""
    text = line.decode("utf-8", "surrogateescape")
    return all(c.isprintable() or ord(c) < 0xA1 or c == "\xad" or 0xDC80 <= ord(c) <= 0xDCFF
               for c in text)


@pytest.fixture(scope="module", params=luarun.interpreter_params())
def lua(request: pytest.FixtureRequest) -> str:
    return luarun.require(request.param)


@settings(deadline=None, database=None, max_examples=15,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture,
                                 HealthCheck.filter_too_much])
@given(st.lists(st.lists(_LINE_BYTES.filter(_lua_safe), min_size=1, max_size=4),
                min_size=20, max_size=40))
def test_generated_scripts_agree_with_job_submit_lua(lua: str, tmp_path: Path,
                                                     headers: list[list[bytes]]) -> None:
    scripts = [b"#!/bin/bash\n" + b"\n".join(lines) + b"\nsrun x\n" for lines in headers]
    texts = [s.decode("utf-8", "surrogateescape") for s in scripts]
    from_lua = lua_verdicts(texts, tmp_path, lua)
    for text, verdict in zip(texts, from_lua, strict=True):
        assert python_verdict(text, stage_rules=True) == verdict, text[:300]
