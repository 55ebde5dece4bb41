"""The epilog's goodput call: root's record of the job -> ledger -> metrics."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from wrapper import config as config_mod
from wrapper.goodput.hook import after_attempt
from wrapper.state import JobState


def _cfg(tmp_path: Path, extra: str = "") -> config_mod.Config:
    # Slurm is not running in the unit tier: the AdminComment's scontrol fails, as it
    # does when slurmctld is down, and the hook goes on.
    text = f'[metrics]\ntextfile = "{tmp_path / "m.prom"}"\n[slurm]\n' \
           f'scontrol_command = "/bin/false"\n{extra}'
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
    first = after_attempt(cfg, state, attempt=0, node="n1", kind="hang", decision="requeue")
    assert first is not None and first.failures == 1
    state.append("prolog.context", attempt=1, node="n1", context={"nodes": ["n1"]})
    state.append("attempt.end", attempt=1, node="n1", kind="success", decision="done")
    second = after_attempt(cfg, state, attempt=1, node="n1", kind="success", decision="done")
    assert second is not None
    series = _series(tmp_path / "m.prom")
    node = (("node", "n1"),)
    assert series[("jobwrap_restart_gaps_total", (("class", "hang"), *node))] == 1
    assert series[("jobwrap_jobs_ended_total", node)] == 1
    assert abs(series[("jobwrap_goodput_wall_seconds_total", node)] - second.wall_s) < 1e-3


def test_an_unreadable_state_never_fails_the_epilog(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    state = JobState(tmp_path / "nothing-here", "8")
    ledger = after_attempt(cfg, state, attempt=0, node="n1", kind="hang", decision="stop")
    assert ledger is not None and ledger.attempts == []
    assert not (tmp_path / "m.prom").exists()


def test_the_admin_comment_holds_root_words_only() -> None:
    from wrapper.goodput.accounting import Attempt, account
    from wrapper.goodput.sacct import MAX_COMMENT, comment

    ledger = account([Attempt(0, 0, 10, "hang"), Attempt(1, 20, 30, "a b;$(x)")], now=40)
    text = comment(ledger, {0: "requeue", 1: "stop"})
    assert text == "jobwrap: a0=hang/requeue a1=a_b___x_/stop ettr=0.00"
    many = account([Attempt(i, i * 10, i * 10 + 5, "node_failure") for i in range(200)],
                   now=9999)
    long = comment(many, {})
    assert len(long) <= MAX_COMMENT and long.startswith("jobwrap: a") and "a199=" in long
