"""The README's "Try it" keeps two set-up commands and explains each part of the demo."""

from __future__ import annotations

import re
from pathlib import Path

from jobwrap_dev.sandbox.demo import PARTS

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
TRY_IT = README[README.index("## Try it"):README.index("\n## ", README.index("## Try it") + 1)]


def test_try_it_has_exactly_the_demo_and_the_test_command() -> None:
    blocks = re.findall(r"^```\n(.*?)```$", TRY_IT, re.S | re.M)
    assert blocks == ["bash tools/demo\n", "bash tools/test\n"], blocks


def test_what_you_just_saw_explains_every_part() -> None:
    saw = TRY_IT[TRY_IT.index("What you just saw"):TRY_IT.index("bash tools/test")]
    numbered = re.findall(r"^(\d+)\. \*\*", saw, re.M)
    assert numbered == [str(n) for n in range(1, PARTS + 1)], numbered
