"""The slow-node judge on samples as the nodes send them (pure).

Each case is a sequence of rounds 3 s apart (the default sample interval), with the
default window (60 s), threshold (0.85) and hold (30 s). A rank's ``busy`` grows by its
demand (the share of a second it ran or waited for a CPU) each second."""

from __future__ import annotations

import random
from typing import Any

import pytest

from wrapper.pulse.judge import SlowJudge

STEP = 3.0


def rounds(rates: dict[str, float | list[float]], seconds: float, *, start: float = 0.0,
           busy: dict[tuple[str, int], float] | None = None
           ) -> list[tuple[float, dict[str, Any]]]:
    """Rounds in which each node's ranks need ``rates[node]`` of a CPU (one rate per rank,
    or one for its only rank)."""
    per_rank = {n: r if isinstance(r, list) else [r] for n, r in rates.items()}
    busy = busy if busy is not None else {}
    out = []
    t = start
    while t < start + seconds - 1e-9:
        for node, node_rates in per_rank.items():
            for i, rate in enumerate(node_rates):
                busy[(node, i)] = busy.get((node, i), 0.0) + rate * STEP
        out.append((t, {n: (t, {"node": n, "t": t, "ranks": [
            {"pid": 100 + i, "rank": f"{n}.{i}", "busy": busy[(n, i)]}
            for i in range(len(per_rank[n]))]}) for n in per_rank}))
        t += STEP
    return out


def named(judge: SlowJudge, played: list[tuple[float, dict[str, Any]]],
          stuck: bool = False) -> list[tuple[float, str]]:
    """The nodes named, when; the job's nodes are those of the first round (none lost)."""
    out = []
    for t, samples in played:
        out += [(t, n) for n in judge.round(t, samples, sorted(played[0][1]), stuck=stuck)]
    return out


def test_a_node_30_percent_slower_among_three_is_named_within_two_minutes() -> None:
    judge = SlowJudge()
    got = named(judge, rounds({"n1": 0.7, "n2": 0.7, "n3": 1.0}, 180))
    assert [n for _, n in got] == ["n3"] and got[0][0] <= 120, got
    assert judge.scores == {"n1": 1.0, "n2": 1.0, "n3": 0.7}
    assert judge.named == {"n3": 0.7}


def test_a_node_is_scored_by_its_slowest_rank_and_named_once() -> None:
    judge = SlowJudge()
    got = named(judge, rounds({"n1": [0.6, 0.6], "n2": [0.6, 1.0], "n3": [0.6, 0.6]}, 400))
    assert [n for _, n in got] == ["n2"]  # once per attempt, however long it stays slow
    assert judge.scores["n2"] == 0.6 and judge.scores["n1"] == 1.0


def test_a_balanced_job_with_noise_names_no_node_in_ten_minutes() -> None:
    rng = random.Random(7)  # noqa: S311 - a fixed noise, not a secret
    judge, busy = SlowJudge(), dict[tuple[str, int], float]()
    got = []
    for i in range(200):  # each rank's demand wandering by +-10% a round
        rates = {n: 0.8 * (1 + rng.uniform(-0.1, 0.1)) for n in ("n1", "n2", "n3")}
        got += named(judge, rounds(dict(rates), STEP, start=i * STEP, busy=busy))
    assert got == [] and min(judge.scores.values()) > 0.9, judge.scores


def test_a_slowdown_shorter_than_the_hold_names_nothing() -> None:
    judge, busy = SlowJudge(), dict[tuple[str, int], float]()
    played = rounds({"n1": 0.7, "n2": 0.7, "n3": 1.0}, 24, busy=busy) + \
        rounds({"n1": 1.0, "n2": 1.0, "n3": 1.0}, 150, start=24, busy=busy)
    assert named(judge, played) == [] and min(judge.scores.values()) > 0.95


@pytest.mark.parametrize("case", ["stuck", "idle", "one node", "no busy"])
def test_a_hang_an_idle_job_one_node_or_no_schedstat_names_nothing(case: str) -> None:
    judge = SlowJudge()
    rates: dict[str, float | list[float]] = {"n1": 0.7, "n2": 0.7, "n3": 1.0}
    if case == "idle":
        rates = {"n1": 0.01, "n2": 0.01, "n3": 0.04}
    elif case == "one node":
        rates = {"n1": [0.7, 1.0, 0.7]}
    played = rounds(rates, 240)
    if case == "no busy":
        for _, samples in played:
            for _, sample in samples.values():
                for r in sample["ranks"]:
                    r["busy"] = "soon"  # a sample without a number (an older watcher)
    assert named(judge, played, stuck=case == "stuck") == []


def test_a_node_whose_ranks_end_stops_the_judging_and_its_score_stays() -> None:
    judge = SlowJudge()
    played = rounds({"n1": 0.7, "n2": 0.7, "n3": 1.0}, 60)
    for t, samples in rounds({"n1": 0.7, "n2": 0.7}, 120, start=60):
        played.append((t, samples))
    assert named(judge, played) == []  # n3 left before its 30 s under the threshold
    assert judge.scores == {"n1": 1.0, "n2": 1.0, "n3": 0.7}  # as the job ended: kept


def test_a_lost_node_leaves_the_judge_and_the_others_are_judged_on() -> None:
    judge = SlowJudge()
    played = rounds({"n1": 0.7, "n2": 0.7, "n3": 0.7, "n4": 1.0}, 30)
    played += rounds({"n1": 0.7, "n2": 0.7, "n4": 1.0}, 150, start=30)
    got = []
    for t, samples in played:
        alive = [n for n in sorted(samples) if n != "n3"] if t >= 30 else sorted(samples)
        got += [(t, n) for n in judge.round(t, samples, alive)]
    assert [n for _, n in got] == ["n4"] and "n3" not in judge.scores, (got, judge.scores)


def test_a_node_whose_samples_stop_coming_names_no_healthy_node() -> None:
    """A node's last sample stays in the snapshot; were it read again each round, its
    ranks' demand would fall toward 0 and pull the median down on the others."""
    judge = SlowJudge()
    played = rounds({"n1": 0.9, "n2": 0.9}, 90)
    frozen = played[-1][1]["n2"]
    busy = {("n1", 0): played[-1][1]["n1"][1]["ranks"][0]["busy"]}
    for t, samples in rounds({"n1": 0.9}, 150, start=90, busy=busy):
        played.append((t, {**samples, "n2": frozen}))
    assert named(judge, played) == [] and judge.scores == {"n1": 1.0, "n2": 1.0}


def test_the_same_sample_seen_twice_adds_one_point() -> None:
    judge = SlowJudge()
    played = rounds({"n1": 0.7, "n2": 0.7, "n3": 1.0}, 180)
    doubled = [(t + d, samples) for t, samples in played for d in (0.0, 1.0)]
    assert [n for _, n in named(judge, doubled)] == ["n3"]
    assert judge.scores["n3"] == 0.7  # not diluted by the repeats


@pytest.mark.parametrize("window", [15.0, 20.0, 60.0])
def test_every_window_the_config_allows_scores(window: float) -> None:
    judge = SlowJudge(window=window, hold=0.0)
    got = named(judge, rounds({"n1": 0.7, "n2": 0.7, "n3": 1.0}, window * 3))
    assert [n for _, n in got] == ["n3"], (window, judge.scores)


@pytest.mark.parametrize("ranks", [1, 2])
def test_one_rank_evaluating_while_the_other_node_waits_names_nothing(ranks: int) -> None:
    """Rank 0 evaluates for 5 minutes while the other node's ranks wait, idle: no node is
    slow (CI once saw a 2-node job's first node named at 0.5 for its pauses). A straggler
    on two nodes is still named."""
    judge = SlowJudge()
    evaluating = [1.0] + [0.02] * (ranks - 1)
    assert named(judge, rounds({"n1": evaluating, "n2": [0.02] * ranks}, 300)) == []
    judge = SlowJudge()
    got = named(judge, rounds({"n1": [0.7] * ranks, "n2": [1.0] * ranks}, 180))
    assert [n for _, n in got] == ["n2"], got
