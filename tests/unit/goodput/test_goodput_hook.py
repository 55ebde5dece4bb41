"""The epilog's goodput call: root's record of the job -> ledger -> metrics."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.support.archive import run_attempt
from wrapper import config as config_mod
from wrapper.archive import archive_attempt
from wrapper.goodput.hook import after_attempt, attempt_records, ledger_of
from wrapper.job.record import JobRecord
from wrapper.job.state import JobState
from wrapper.osl.users import UserIds
from wrapper.slurm.fake import FakeSlurm


def _cfg(tmp_path: Path, extra: str = "") -> config_mod.Config:
    text = f'[metrics]\ntextfile = "{tmp_path / "m.prom"}"\n{extra}'
    return config_mod.parse(text.encode(), str(tmp_path / "config.toml"))


def _series(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(path.read_text()) for s in f.samples}


def test_each_attempt_end_exports_its_share_of_the_ledger(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    state = JobState(tmp_path / "state", "7")
    state.prepare(None, None)
    state.append("prolog.context", attempt=0, node="n1", context={"nodes": ["n1"]})
    state.append("attempt.end", attempt=0, node="n1", kind="hang", decision="requeue")
    slurm = FakeSlurm(jobs={"7": {"JobId": "7"}})
    first = after_attempt(cfg, state, slurm, attempt=0, node="n1", kind="hang",
                          decision="requeue")
    assert first is not None and first.failures == 1
    assert slurm.jobs["7"]["AdminComment"] == "jobwrap: a0=hang/requeue ettr=0.00"
    state.append("prolog.context", attempt=1, node="n1", context={"nodes": ["n1"]})
    state.append("attempt.end", attempt=1, node="n1", kind="success", decision="done")
    second = after_attempt(cfg, state, slurm, attempt=1, node="n1", kind="success",
                           decision="done")
    assert second is not None
    series = _series(tmp_path / "m.prom")
    node = (("node", "n1"),)
    assert series[("jobwrap_restart_gaps_total", (("class", "hang"), *node))] == 1
    assert series[("jobwrap_jobs_ended_total", node)] == 1
    assert abs(series[("jobwrap_goodput_wall_seconds_total", node)] - second.wall_s) < 1e-3


def test_an_unreadable_state_never_fails_the_epilog(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    state = JobState(tmp_path / "nothing-here", "8")
    # nor a Slurm that refuses the AdminComment (slurmctld down: a job it does not know)
    ledger = after_attempt(cfg, state, FakeSlurm(), attempt=0, node="n1", kind="hang",
                           decision="stop")
    assert ledger is not None and ledger.attempts == []
    assert not (tmp_path / "m.prom").exists()


def test_the_admin_comment_holds_root_words_only() -> None:
    from wrapper.archive.ledger import Attempt, account
    from wrapper.goodput.sacct import MAX_COMMENT, comment

    ledger = account([Attempt(0, 0, 10, "hang"), Attempt(1, 20, 30, "a b;$(x)")], now=40)
    text = comment(ledger, {0: "requeue", 1: "stop"})
    assert text == "jobwrap: a0=hang/requeue a1=a_b___x_/stop ettr=0.00"
    many = account([Attempt(i, i * 10, i * 10 + 5, "node_failure") for i in range(200)],
                   now=9999)
    long = comment(many, {})
    assert len(long) <= MAX_COMMENT and long.startswith("jobwrap: a") and "a199=" in long


def test_attempts_on_other_nodes_come_from_the_archive(
        shared: Path, user: UserIds, archive_config: Callable[..., config_mod.Config],
        job_record: Callable[..., JobRecord], user_state: Callable[..., JobState]) -> None:
    """The state folder is node-local: attempt 0 ran elsewhere, its manifest tells it."""
    cfg = archive_config(max_age_days=0.5)
    rec = job_record(nodes=["n1"])
    elsewhere = user_state()
    run_attempt(elsewhere, 0, ["n1"], kind="hang", decision="requeue", checkpoints=(5,))
    archive_attempt(cfg, elsewhere, rec, attempt=0, node="n1", script_text="#!/bin/sh\n",
                    extra={})
    here = JobState(shared / "state-here", "42")
    here.prepare(user.uid, user.gid)
    run_attempt(here, 1, ["n2"], checkpoints=(9,))
    records = attempt_records(here, cfg.paths.archive_root, user.name)
    assert [(r["attempt"], r["outcome"], r["decision"]) for r in records] == [
        (0, "hang", "requeue"), (1, "success", "done")]
    ledger = ledger_of(here, archive_root=cfg.paths.archive_root, user=user.name)
    assert ledger.failures == 1 and ledger.attempts[1].gap_before_s >= 0
    assert ledger.gaps_by_class.keys() == {"hang"}
    assert [a.kind for a in ledger_of(here).attempts] == ["success"]  # this node alone
