"""``jobwrap release``: a requeued job is made eligible at once, away from the nodes to
avoid, unless avoiding them all would leave it unable to run; then Slurm's own requeue
delay runs its course (a node whose prolog Slurm skipped runs it again after it)."""

from __future__ import annotations

import pytest

from wrapper import slurm
from wrapper.config import Config
from wrapper.restart.release import release
from wrapper.slurm.fake import FakeSlurm


class Capped(FakeSlurm):
    """Slurm's side of a 2-node job on a 3-node partition: one node may be excluded."""

    def exclude_nodes(self, job_id: str, nodes: list[str]) -> list[str]:
        self.calls.append(("exclude_nodes", job_id, *nodes))
        return list(nodes)[:1]


@pytest.mark.parametrize(("exclude", "released"), [(["n2"], True), (["n2", "n1"], False),
                                                    ([], True)])
def test_a_release_never_starts_a_job_it_could_not_move(monkeypatch: pytest.MonkeyPatch,
                                                        exclude: list[str],
                                                        released: bool) -> None:
    fake = Capped(jobs={"7": {"JobState": "PENDING"}})
    monkeypatch.setattr(slurm, "backend", lambda *a, **k: fake)
    assert release("7", Config(), exclude, sleep=lambda s: None) is released
    assert (("release_now", "7") in fake.calls) is released
