from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wrapper.archive.patterns import NO_VAL, PatternValues, candidates, expand, resolve

JOB = PatternValues(job_id="42", user="alice", job_name="train", node="n1", work_dir="/w")
ARRAY = PatternValues(job_id="45", user="alice", job_name="sweep", node="gpu07",
                      array_job_id="40", array_task_id="13", work_dir="/w")
STEP = PatternValues(job_id="42", user="alice", job_name="train", node="n3", node_index=2,
                     step="3", task=5)


@pytest.mark.parametrize(("pattern", "values", "expected"), [
    ("slurm-%j.out", JOB, "slurm-42.out"),
    ("%x-%j.out", JOB, "train-42.out"),
    ("%u/%N.log", JOB, "alice/n1.log"),
    ("%A_%a.out", ARRAY, "40_13.out"),
    ("%A_%a.out", JOB, f"42_{NO_VAL}.out"),
    ("%b", ARRAY, "3"),
    ("%j", ARRAY, "45"),
    ("%%j", JOB, "%j"),
    ("100%%", JOB, "100%"),
    ("%5j", JOB, "00042"),
    ("%12j", JOB, "0000000042"),  # at most 10 wide
    ("%3N", JOB, "n1"),  # padding is for numbers only
    ("%J", JOB, "42"),  # the batch script: the job id alone
    ("%J", STEP, "42.3"),
    ("%s", JOB, "batch"),
    ("%s", STEP, "3"),
    ("%n-%t", JOB, "0-0"),
    ("%n-%2t", STEP, "2-05"),
    ("%N", STEP, "n3"),
    ("%q", JOB, "%q"),  # not a field: kept as it is
    ("%12q", JOB, "2q"),  # Slurm's quirk: digits before a non-field keep the last one
    ("a%", JOB, "a"),  # a lone trailing % is dropped
    ("out\\%j", JOB, "out%j"),  # a backslash turns expansion off
    ("", JOB, ""),
    ("plain/name.txt", JOB, "plain/name.txt"),
])
def test_expand(pattern: str, values: PatternValues, expected: str) -> None:
    assert expand(pattern, values) == expected


def test_relative_paths_are_taken_against_the_work_dir() -> None:
    assert resolve("out-%j.txt", JOB) == "/w/out-42.txt"
    assert resolve("/abs/%x.txt", JOB) == "/abs/train.txt"
    assert resolve("rel.txt", PatternValues(job_id="1")) == "rel.txt"  # no work dir known


def test_candidates_try_both_readings_of_a_leftover_percent() -> None:
    # Slurm 23.02+ turns %% into % before we see it; 22.05 leaves %N for us to expand.
    assert candidates("/w/a%j.out", JOB) == ["/w/a42.out", "/w/a%j.out"]
    assert candidates("/w/plain.out", JOB) == ["/w/plain.out"]
    assert candidates("rel-%N", JOB) == ["/w/rel-n1", "/w/rel-%N"]


_LITERAL = st.text(st.characters(blacklist_characters="%\\", blacklist_categories=("Cs",)),
                   max_size=8)
_FIELDS = {"%j": "42", "%x": "train", "%u": "alice", "%N": "n1", "%n": "0", "%t": "0",
           "%%": "%", "%A": "42", "%s": "batch", "%J": "42", "%4j": "0042"}


@given(st.lists(st.one_of(_LITERAL, st.sampled_from(sorted(_FIELDS))), max_size=12))
def test_expansion_is_the_concatenation_of_its_pieces(pieces: list[str]) -> None:
    assert expand("".join(pieces), JOB) == "".join(_FIELDS.get(p, p) for p in pieces)


@given(st.text(st.characters(blacklist_characters="\\", blacklist_categories=("Cs",))))
def test_doubling_every_percent_escapes_it(text: str) -> None:
    assert expand(text.replace("%", "%%"), JOB) == text


@given(st.text())
def test_any_text_expands_without_error(text: str) -> None:
    assert isinstance(expand(text, ARRAY), str)
