"""Property-based fuzzing of TOML configs: a Config, or one ConfigError naming file and key.

Whatever an admin (or a broken deployment) puts in the file, loading it must never end
in a traceback: every hook and the login guard load it first.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wrapper import config
from wrapper.errors import ConfigError
from wrapper.loginguard.rules import Policy

PATH = "/etc/jobwrap/fuzz.toml"
KNOWN = {name: sorted(cls._fields) for name, cls in config.SECTIONS.items()}
BARE_KEY = st.text("abcdefghijklmnopqrstuvwxyz_-0123456789", min_size=1, max_size=12)


def _string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


SCALARS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["0", "-1", "1e999", "-1e999", "nan", "inf", "-inf", "+nan", "0.0",
                     "1e-320", "9" * 400, "0x7fffffffffffffff", "1979-05-27T07:32:00Z",
                     "07:32:00", "1979-05-27", "true", "false"]),
    st.floats(allow_nan=True, allow_infinity=False).map(repr).filter(lambda s: s != "nan"),
    st.booleans().map(lambda b: "true" if b else "false"),
    st.text(max_size=30).map(_string),
    st.sampled_from(["/", "/var/lib/x", "relative", "", "{node}", "cli", "drain", "warn",
                     "fake", "a=b", "cc1plus=2", "make=0.5", "=0.1", "terminate"]).map(_string),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.dictionaries(BARE_KEY, inner, max_size=3).map(
            lambda d: "{" + ", ".join(f"{k} = {v}" for k, v in d.items()) + "}"),
    ),
    max_leaves=8,
)


@st.composite
def documents(draw: st.DrawFn) -> tuple[str, list[tuple[str, str]]]:
    """A TOML document of known and unknown sections and keys, and its (section, key)s."""
    names = draw(st.lists(st.one_of(st.sampled_from(sorted(KNOWN)), BARE_KEY), min_size=1,
                          max_size=4, unique=True))
    lines: list[str] = []
    entries: list[tuple[str, str]] = []
    for name in names:
        lines.append(f"[{name}]")
        keys = KNOWN.get(name, [])
        chosen = draw(st.lists(st.one_of(st.sampled_from(keys), BARE_KEY) if keys
                               else BARE_KEY, max_size=6, unique=True))
        for key in chosen:
            lines.append(f"{key} = {draw(VALUES)}")
            entries.append((name, key))
    return "\n".join(lines) + "\n", entries


def check(raw: bytes) -> config.Config | None:
    """Load ``raw``: a Config, or None after checking the ConfigError names the file."""
    try:
        loaded = config.parse(raw, PATH)
    except ConfigError as exc:
        assert exc.path == PATH and PATH in str(exc) and exc.problems
        return None
    # The login guard checks what the schema cannot; that too ends in a ConfigError.
    try:
        Policy.from_config(loaded.login_guard, loaded.source)
    except ConfigError as exc:
        assert PATH in str(exc)
        assert all(p.startswith("[login_guard] ") for p in exc.problems)
    # What it loaded renders back to TOML that loads to the same settings.
    assert config.parse(config.to_toml(loaded).encode(), PATH) == loaded
    return loaded


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents())
def test_any_document_loads_or_is_refused_with_its_keys_named(
        document: tuple[str, list[tuple[str, str]]]) -> None:
    text, entries = document
    try:
        config.parse(text.encode(), PATH)
    except ConfigError as exc:
        message = str(exc)
        assert PATH in message
        for problem in exc.problems:
            # Each problem names a section or a key of the document (or is about syntax).
            assert (problem.startswith("not valid TOML")
                    or any(f"[{s}] {k}" in problem for s, k in entries)
                    or any(f"[{s}]" in problem or problem.startswith(f"{s} ")
                           for s, _ in entries)
                    or "section [" in problem), problem
    check(text.encode())


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(sorted(KNOWN)), st.data())
def test_one_bad_value_is_refused_naming_its_key(section: str, data: st.DataObject) -> None:
    key = data.draw(st.sampled_from(KNOWN[section]))
    value = data.draw(VALUES)
    text = f"[{section}]\n{key} = {value}\n"
    try:
        config.parse(text.encode(), PATH)
    except ConfigError as exc:
        # each problem names the key: a value at odds with other keys' defaults names both
        # ("[pulse] lost_after = 4.5 with [pulse] interval = 2: ..."), once per other key
        assert exc.problems
        for problem in exc.problems:
            assert problem.startswith("not valid TOML") or f"[{section}] {key} = " in problem, \
                problem
        assert PATH in str(exc)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_end_in_a_traceback(raw: bytes) -> None:
    check(raw)


def test_hostile_documents_are_refused_with_a_message() -> None:
    for raw in [b"x = " + b"[" * 50_000 + b"]" * 50_000,
                b"[hooks]\nprolog_budget = nan\n",
                b"[hooks]\nprolog_budget = " + b"9" * 400 + b"\n",
                b"[login_guard]\nthrottle_nice = " + b"9" * 400 + b"\n",
                b"[login_guard]\nthrottle_nice = " + b"9" * 5000 + b"\n",
                b"[paths]\nstate_dir = \"\\u0000\"\n",
                b"\xff\xfe", b"[[paths]]\n", b"paths = 1\n"]:
        assert check(raw) is None, raw[:60]


def test_a_file_is_loaded_by_its_path(tmp_path: Path) -> None:
    bad = tmp_path / "c.toml"
    bad.write_bytes(b"[login_guard]\nsession_cpu_cores = -inf\n")
    try:
        config.load(str(bad))
    except ConfigError as exc:
        assert str(bad) in str(exc) and "[login_guard] session_cpu_cores" in str(exc)
    else:
        raise AssertionError("a negative infinity was accepted")
