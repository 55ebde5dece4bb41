"""The directives' grammar: what is accepted, what is refused and how the refusal reads."""

from __future__ import annotations

import os
import posixpath
import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from wrapper.errors import UserInputError
from wrapper.staging import StageIn, StageOut, parse_stage_in, parse_stage_out
from wrapper.staging.spec import member_path, scratch_path
from wrapper.staging.tree import is_inner_path


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/shared/imagenet", StageIn("/shared/imagenet", "/shared/imagenet", "imagenet")),
        ("/shared/imagenet/", StageIn("/shared/imagenet/", "/shared/imagenet", "imagenet")),
        ("/shared/imagenet:data", StageIn("/shared/imagenet:data", "/shared/imagenet", "data")),
        ("/d/x.tar:in/x:unpack", StageIn("/d/x.tar:in/x:unpack", "/d/x.tar", "in/x", True)),
        ("/d/x.tar:.:unpack", StageIn("/d/x.tar:.:unpack", "/d/x.tar", ".", True)),
        ("/d/a:./b//c/", StageIn("/d/a:./b//c/", "/d/a", "b/c")),
        ("rel/data:d", StageIn("rel/data:d", "rel/data", "d")),  # against the work dir
        ("/d/../e/f:g", StageIn("/d/../e/f:g", "/e/f", "g")),  # the user's own path
        ("/d/a:unpack", StageIn("/d/a:unpack", "/d/a", "unpack")),  # a folder named unpack
        ("/d/résumé:données", StageIn("/d/résumé:données", "/d/résumé", "données")),
    ],
)
def test_stage_in_accepts(value: str, expected: StageIn) -> None:
    assert parse_stage_in(value) == expected


@pytest.mark.parametrize(
    ("value", "fragments"),
    [
        ("", ["--stage-in=: the value is empty", "--stage-in=SRC[:DEST[:unpack]]"]),
        ("/a:../etc", ["DEST '../etc' uses '..' to leave the scratch folder", "e.g. 'data'"]),
        ("/a:x/../../y", ["uses '..'"]),
        ("/a:/etc/passwd", ["DEST '/etc/passwd' is absolute", "relative to the job's scratch",
                            "'etc/passwd'"]),
        ("/a:~/x", ["starts with '~', which is not expanded"]),
        ("/a:x\x00y", ["control character '\\x00'"]),
        ("/a:x\ny", ["control character '\\n'"]),
        ("/a:", ["DEST '' is empty"]),
        (":b", ["SRC '' is empty"]),
        ("/a:b:extract", ["unknown mode 'extract'", "the only mode is 'unpack'"]),
        ("/a:b:c:d", ["too many ':'"]),
        ("s3://bucket/x:d", ["looks like a URL", "mounted on the node"]),
        ("s3://bucket/x", ["looks like a URL"]),
        ("/", ["cannot name the copy after SRC '/'", "give DEST"]),
        ("/a:" + "n" * 256, ["longer than 255 bytes"]),
        ("/a:" + "n/" * 2100, ["longer than 4095 bytes"]),
        ("~/data", ["SRC '~/data' starts with '~'", "write the full path"]),
        ("/a:\udcff", ["not valid UTF-8"]),
    ],
)
def test_stage_in_refuses_with_a_message_that_says_what_to_fix(value: str,
                                                               fragments: list[str]) -> None:
    with pytest.raises(UserInputError) as info:
        parse_stage_in(value)
    message = str(info.value)
    assert message.startswith(f"--stage-in={value}:")
    assert "\n" not in message.replace(value, "")  # one line (the value itself aside)
    for fragment in fragments:
        assert fragment in message


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("results:/shared/me/run1", StageOut("results:/shared/me/run1", "results",
                                             "/shared/me/run1")),
        ("./out/:out", StageOut("./out/:out", "out", "out")),  # DEST against the work dir
        (".:/shared/all", StageOut(".:/shared/all", ".", "/shared/all")),
    ],
)
def test_stage_out_accepts(value: str, expected: StageOut) -> None:
    assert parse_stage_out(value) == expected


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("results", "expected SRC:DEST"),
        ("/abs:/shared/x", "SRC '/abs' is absolute"),
        ("../up:/shared/x", "SRC '../up' uses '..'"),
        ("a:b:c", "expected SRC:DEST"),
        ("a:http://x", "looks like a URL"),
        ("a:", "DEST '' is empty"),
    ],
)
def test_stage_out_refuses(value: str, fragment: str) -> None:
    with pytest.raises(UserInputError, match=r"^--stage-out=") as info:
        parse_stage_out(value)
    assert fragment in str(info.value)


def test_archive_member_names() -> None:
    assert member_path("./a//b/", where="x") == "a/b"
    assert member_path("./", where="x") == ""
    assert member_path("a/new\nline", where="x") == "a/new\nline"  # odd, yet inside
    for bad in ("/etc/passwd", "../x", "a/../../x", "a\x00b"):
        with pytest.raises(UserInputError):
            member_path(bad, where="x")


_hostile = st.lists(st.sampled_from(["a", "b", ".", "/", "~", " ", "\x00", "\n", "..", ":",
                                     "é", "\\", "../", "/.."]), max_size=16).map("".join)


@given(text=st.one_of(_hostile, st.text(max_size=40)))
@example(text="a/../../etc")
@example(text="./../x")
@example(text="....")
def test_no_accepted_dest_resolves_outside_scratch(text: str) -> None:
    """Whatever DEST a user writes, if it is accepted, it names a place inside scratch."""
    _check_dest(text)


# Odd DESTs that are accepted: the two properties above and below are checked on these
# whatever Hypothesis draws, so neither can pass by refusing everything it tried.
ACCEPTED = ("a/~", "./x", "x/./y", "..a", "a..", "a b", "é/\\", "a//b/")


def test_the_escape_properties_are_checked_on_accepted_values() -> None:
    assert [text for text in ACCEPTED if not _check_dest(text)] == []
    assert [text for text in ACCEPTED if not _check_stage_in(text)] == []


def _check_dest(text: str) -> bool:
    """The DEST property on ``text``; whether it was accepted."""
    scratch = "/local/jobwrap/123"
    try:
        dest = scratch_path(text, directive="--stage-in=/x", role="DEST")
    except UserInputError as exc:
        assert str(exc).startswith("--stage-in=/x: DEST")
        return False
    joined = posixpath.normpath(posixpath.join(scratch, dest))
    assert joined == scratch or joined.startswith(scratch + "/")
    assert not dest.startswith("/") and ".." not in dest.split("/")
    assert dest == "." or is_inner_path(dest)
    assert scratch_path(dest, directive="x", role="DEST") == dest  # normal form is stable
    return True


@given(text=st.one_of(_hostile, st.text(max_size=40)))
def test_no_accepted_stage_in_value_escapes(text: str) -> None:
    """The same through the whole parser, with and without :unpack."""
    _check_stage_in(text)


def _check_stage_in(text: str) -> bool:
    """The property through the parser; whether ``/shared/d:TEXT`` was accepted."""
    accepted = []
    for value in (f"/shared/d:{text}", f"/shared/d:{text}:unpack", text):
        try:
            spec = parse_stage_in(value)
        except UserInputError:
            accepted.append(False)
            continue
        accepted.append(True)
        joined = os.path.normpath(os.path.join("/scratch", spec.dest))
        assert joined == "/scratch" or joined.startswith("/scratch/")
    return accepted[0]


def test_a_dest_whose_normal_form_starts_with_a_tilde_is_refused() -> None:
    # found by Hypothesis: "./~" was accepted as "~", which is itself refused
    with pytest.raises(UserInputError, match=re.escape("starts with '~' once './' is dropped")):
        scratch_path("./~", directive="--stage-in=/x", role="DEST")
    assert scratch_path("a/~", directive="--stage-in=/x", role="DEST") == "a/~"
