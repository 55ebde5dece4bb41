"""The epilog's goodput call: root's record of the job -> ledger -> metrics."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from wrapper import config as config_mod
from wrapper.goodput.hook import after_attempt
from wrapper.state import JobState


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
