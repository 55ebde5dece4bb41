"""Young/Daly checkpoint interval advice."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from wrapper.archive.ledger import Attempt, Checkpoint, account
from wrapper.goodput import advice


def test_young_daly_and_when_to_say_it() -> None:
    assert advice.young_daly(3600, 18) == pytest.approx(math.sqrt(2 * 3600 * 18))  # 360 s
    assert advice.advise(300, 3600, 18) is None  # close enough
    far = advice.advise(30, 3600, 18)
    assert far is not None and "less often" in far and "every 6m00s" in far
    assert "more often" in str(advice.advise(3600, 3600, 18))
    assert advice.advise(None, 3600, 18) is None  # no interval of its own
    assert advice.advise(30, None, 18) is None  # no failure seen: no MTBF
    assert advice.advise(30, 3600, 0.0) is None


def test_the_save_time_of_a_folder_checkpoint(tmp_path: Path) -> None:
    folder = tmp_path / "step-100"
    folder.mkdir()
    for i, name in enumerate(("a", "b", "c")):
        (folder / name).write_bytes(b"x")
        os.utime(folder / name, (1000 + 7 * i, 1000 + 7 * i))
    os.symlink("/etc/passwd", folder / "link")  # never followed, never counted
    assert advice.folder_save_s(str(folder)) == 14
    assert advice.folder_save_s(str(folder / "a")) is None
    assert advice.folder_save_s(str(tmp_path / "missing")) is None


def test_for_job_uses_the_measured_save_time_and_the_jobs_own_mtbf(tmp_path: Path) -> None:
    points = tuple(Checkpoint(100 + 10 * i, i, save_s=5.0) for i in range(10))
    ledger = account([Attempt(0, 100, 200, "hang", points),
                      Attempt(1, 210, 300, "success", resumed_step=9)], now=400)
    # no archive: MTBF is the job's own (190 s of attempts, 1 failure) -> sqrt(2*190*5) ~ 44 s
    said = advice.for_job(str(tmp_path / "no-archive"), ledger, None, now=400)
    assert said is not None and "less often" in said
