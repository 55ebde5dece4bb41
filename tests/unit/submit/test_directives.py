from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wrapper.errors import UserInputError
from wrapper.submit.directives import JobOptions, parse_args, parse_duration, parse_script

SCRIPT = """#!/bin/bash
#SBATCH --nodes=2
#JOBWRAP --checkpoint-dir=ckpt --max-restarts=5
#JOBWRAP --stage-in=/data/set:set --stage-in /data/b.tar:b:unpack
#JOBWRAP --hang-timeout=30m --stage-out=results:/home/a/out
# a plain comment
#JOBWRAP --no-requeue

python train.py
#JOBWRAP --max-restarts=9
"""


def test_parse_script() -> None:
    options = parse_script(SCRIPT)
    assert options == JobOptions(
        checkpoint_dir="ckpt", max_restarts=5, hang_timeout=1800.0,
        stage_in=("/data/set:set", "/data/b.tar:b:unpack"),
        stage_out=("results:/home/a/out",), no_requeue=True)


def test_directives_after_the_first_command_are_ignored_like_sbatch() -> None:
    assert parse_script(SCRIPT).max_restarts == 5


def test_quoted_values() -> None:
    options = parse_script('#!/bin/sh\n#JOBWRAP --checkpoint-dir="my ckpts"\ntrue\n')
    assert options.checkpoint_dir == "my ckpts"


def test_hang_timeout_off() -> None:
    assert parse_script("#!/bin/sh\n#JOBWRAP --hang-timeout=off\ntrue\n").hang_timeout == 0.0
    assert parse_script("#!/bin/sh\ntrue\n").hang_timeout is None  # learned


def test_no_directives() -> None:
    assert parse_script("#!/bin/bash\necho hi\n") == JobOptions()


def test_round_trip_through_a_dict() -> None:
    options = parse_script(SCRIPT)
    assert JobOptions.from_dict(options.as_dict()) == options


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("#JOBWRAP --max-restart=3", "#JOBWRAP line 2: unknown option '--max-restart'; valid"),
        ("#JOBWRAP --max-restarts=three", "--max-restarts='three': expected a whole number"),
        ("#JOBWRAP --hang-timeout=soon", "expected a duration such as 90s, 30m"),
        ("#JOBWRAP --hang-timeout=0", "must be longer than 0 s"),
        ("#JOBWRAP --checkpoint-dir", "--checkpoint-dir needs a value"),
        ("#JOBWRAP --no-requeue=yes", "--no-requeue takes no value"),
        ('#JOBWRAP --checkpoint-dir="open', "No closing quotation"),
    ],
)
def test_bad_directives_name_the_line_and_the_fix(line: str, message: str) -> None:
    with pytest.raises(UserInputError) as info:
        parse_script(f"#!/bin/bash\n{line}\ntrue\n")
    assert message in str(info.value)


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90), ("90s", 90), ("30m", 1800), ("1h30m", 5400), ("2d", 172800),
    ("01:30:00", 5400), ("1-00:00:00", 86400), ("05:00", 300)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@given(st.integers(0, 99), st.integers(0, 23), st.integers(0, 59), st.integers(0, 59))
def test_duration_forms_agree(d: int, h: int, m: int, s: int) -> None:
    total = d * 86400 + h * 3600 + m * 60 + s
    assert parse_duration(f"{d}-{h:02d}:{m:02d}:{s:02d}") == total
    if total:
        assert parse_duration(f"{d}d{h}h{m}m{s}s") == total


def test_run_style_args() -> None:
    options = parse_args(["--checkpoint-dir", "/x", "--max-restarts=2"])
    assert (options.checkpoint_dir, options.max_restarts) == ("/x", 2)
