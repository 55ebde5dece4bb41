"""``jobwrap report``: the cluster view over archived jobs' ledgers."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.archive import jobwrap
from wrapper.archive.ledger import Attempt, Checkpoint, account
from wrapper.goodput.report import FLAKY_SCORE, JobLedger, build, render


def _job(job_id: str, *attempts: Attempt) -> JobLedger:
    return JobLedger(job_id, "alice", account(list(attempts), now=10_000))


def test_failures_by_class_and_node_mtbf_gaps_and_the_ettr_distribution() -> None:
    jobs = [
        _job("1", Attempt(0, 0, 100, "hardware", (Checkpoint(80, 8),), nodes=("bad",)),
             Attempt(1, 120, 300, "success", nodes=("good1",), resumed_step=8)),
        _job("2", Attempt(0, 0, 100, "node_failure", (Checkpoint(50, 5),), nodes=("bad",)),
             Attempt(1, 110, 200, "success", nodes=("good2",))),
        _job("3", Attempt(0, 0, 100, "user_error", nodes=("good1",))),
        *[_job(str(10 + i), Attempt(0, 0, 100, "success", nodes=(f"good{i % 3 + 1}",)))
          for i in range(12)],
    ]
    report = build(jobs)
    assert report.jobs == 15 and report.failures == 3
    assert report.failures_by_class == {"hardware": 1, "node_failure": 1, "user_error": 1}
    assert report.nodes["bad"].node_failures == 2 and report.nodes["good1"].node_failures == 0
    assert report.flaky_nodes == ["bad"] and report.nodes["bad"].score >= FLAKY_SCORE
    assert all(report.nodes[n].score < 1 for n in ("good1", "good2", "good3"))
    assert report.mtbf_s == pytest.approx(report.run_s / 3)
    assert report.mean_restart_gap_s == pytest.approx((20 + 10) / 2)
    assert report.mean_restart_gap_by_class == {"hardware": 20, "node_failure": 10}
    assert report.lost_by_class == {"hardware": 20, "node_failure": 50, "user_error": 100}
    dist = report.ettr_of_ended_jobs
    assert dist["jobs"] == 15 and dist["min"] == 0 and dist["max"] == 1
    assert report.ettr_histogram["<=1"] == 15
    assert report.worst_jobs[0]["job_id"] == "3"
    text = render(report)
    assert "bad" in text and "FLAKY" in text and "MTBF" in text


def test_only_root_confirmed_causes_count_against_a_node() -> None:
    """Issue 22, item 5: classes the job's own output or exit picks (a hang, a collective
    timeout, a kill) pinned on one node among normal jobs never make it flaky."""
    jobs = [_job(str(i), Attempt(0, 0, 100, kind, nodes=("gpu07",)))
            for i, kind in enumerate(["killed", "collective_timeout", "hang", "killed"])]
    jobs += [_job(str(100 + i), Attempt(0, 0, 100, "success", nodes=(f"gpu{i % 4:02d}",)))
             for i in range(40)]
    report = build(jobs)
    assert report.failures == 4 and report.nodes["gpu07"].node_failures == 0
    assert report.flaky_nodes == [] and report.nodes["gpu07"].score < FLAKY_SCORE


def test_a_node_named_slow_again_and_again_is_told_per_node() -> None:
    jobs = [_job(str(i), Attempt(0, 0, 100, "success", nodes=("n1", "n2", "n3"),
                                 slow=(("n3", (70 - i) / 100),) if i % 2 else ()))
            for i in range(6)]
    report = build(jobs)
    assert (report.nodes["n3"].slow, report.nodes["n3"].slowest) == (3, 0.65)
    assert (report.nodes["n1"].slow, report.nodes["n1"].slowest) == (0, None)
    assert report.nodes["n3"].slow_users == 1
    assert "named slow in 3 (1 user; speed down to 0.65)" in render(report)
    assert report.as_dict()["nodes"]["n3"]["slow"] == 3


def test_an_empty_archive_says_so() -> None:
    report = build([])
    assert report.jobs == 0 and report.mtbf_s is None and report.ettr is None
    assert render(report) == "no archived jobs in this period\n"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e5), st.floats(0, 1e5),
                          st.sampled_from(["success", "hang", "hardware", "user_error"]),
                          st.sampled_from(["a", "b", "c"])), min_size=1, max_size=20))
def test_report_properties(items: list[tuple[float, float, str, str]]) -> None:
    jobs = [_job(str(i), Attempt(0, s, s + d, kind, nodes=(node,)))
            for i, (s, d, kind, node) in enumerate(items)]
    report = build(jobs)
    assert report.ettr is None or 0 <= report.ettr <= 1
    assert sum(report.failures_by_class.values()) == report.failures <= report.attempts
    assert report.lost_s <= report.wall_s + 1e-6
    assert all(s.score >= 0 for s in report.nodes.values())


def test_the_command_over_a_real_archive(archived: str) -> None:
    code, out = jobwrap(archived, "report", "--json")
    assert code == 0, out
    data = json.loads(out)
    report = data["report"]
    assert data["problems"] == []
    assert report["jobs"] == 1 and report["attempts"] == 2
    assert report["failures_by_class"] == {"hang": 1} and "n1" in report["nodes"]
    assert report["restart_gaps"] == 1 and report["mtbf_s"] > 0
    code, out = jobwrap(archived, "report", "--since", "1d")
    assert code == 0 and "1 jobs, 2 attempts, 1 failures" in out and "hang" in out
    code, out = jobwrap(archived, "report", "--since", "yesterday-ish")
    assert code == 2 and "--since" in out
