"""The node_exporter textfile: parsed by prometheus-client's own parser, merged across
writers, atomic, and safe with concurrent hooks."""

from __future__ import annotations

import multiprocessing
import os
import stat
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from wrapper import metrics
from wrapper.config import MetricsConfig
from wrapper.metrics import Change, MetricsError, labels


def _series(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample in the file, as prometheus-client reads it."""
    out = {}
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _types(path: Path) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(path.read_text())}


@pytest.fixture
def cfg(tmp_path: Path) -> MetricsConfig:
    return MetricsConfig(textfile=str(tmp_path / "jobwrap.prom"))


def test_every_helper_adds_its_series_and_keeps_the_others(cfg: MetricsConfig) -> None:
    path = Path(cfg.textfile)
    assert metrics.record_node_health(cfg, [("ecc", "0", "pass"), ("ecc", "1", "fail"),
                                            ("driver", "", "warn")], node="n1", now=1000.0)
    assert metrics.record_failure(cfg, "gpu", requeued=True, node="n1")
    assert metrics.record_failure(cfg, "gpu", requeued=True, node="n1")
    assert metrics.record_failure(cfg, "user", requeued=False, node="n1")
    assert metrics.record_staging(cfg, direction="in", bytes_copied=1000, bytes_from_cache=24,
                                  files=3, cache_hits=1, cache_misses=1)
    assert metrics.record_staging(cfg, direction="in", bytes_copied=500, files=2,
                                  cache_misses=1)
    assert metrics.record_login_guard(cfg, rule="cpu", action="warn")
    assert metrics.record_login_guard(cfg, rule="cpu", action="warn")

    series = _series(path)
    assert series[("jobwrap_node_check", (("check", "ecc"), ("gpu", "1"), ("node", "n1"),
                                          ("verdict", "fail")))] == 1
    assert series[("jobwrap_node_check", (("check", "ecc"), ("gpu", "1"), ("node", "n1"),
                                          ("verdict", "pass")))] == 0
    assert series[("jobwrap_node_check", (("check", "driver"), ("gpu", ""), ("node", "n1"),
                                          ("verdict", "warn")))] == 1
    assert series[("jobwrap_node_healthy", (("node", "n1"),))] == 0
    assert series[("jobwrap_node_check_timestamp_seconds", (("node", "n1"),))] == 1000
    assert series[("jobwrap_restarts_total", (("class", "gpu"), ("node", "n1")))] == 2
    assert series[("jobwrap_job_failures_total", (("action", "stop"), ("class", "user"),
                                                  ("node", "n1")))] == 1
    assert ("jobwrap_restarts_total", (("class", "user"), ("node", "n1"))) not in series
    assert series[("jobwrap_staged_bytes_total", (("direction", "in"),
                                                  ("source", "copy")))] == 1500
    assert series[("jobwrap_staged_bytes_total", (("direction", "in"),
                                                  ("source", "cache")))] == 24
    assert series[("jobwrap_staged_files_total", (("direction", "in"),))] == 5
    assert series[("jobwrap_stage_cache_hits_total", ())] == 1
    assert series[("jobwrap_stage_cache_misses_total", ())] == 2
    assert series[("jobwrap_login_guard_actions_total", (("action", "warn"),
                                                         ("rule", "cpu")))] == 2
    types = _types(path)
    assert types["jobwrap_restarts"] == "counter"  # the parser drops _total from the name
    assert types["jobwrap_node_healthy"] == "gauge"


def test_health_replaces_the_nodes_last_verdicts_only(cfg: MetricsConfig) -> None:
    metrics.record_node_health(cfg, [("ecc", "0", "fail"), ("xid", "0", "pass")], node="n1")
    metrics.record_node_health(cfg, [("ecc", "0", "pass")], node="n2")
    metrics.record_node_health(cfg, [("ecc", "0", "pass")], node="n1")
    series = _series(Path(cfg.textfile))
    checks = {(dict(k)["node"], dict(k)["check"]) for (name, k) in series
              if name == "jobwrap_node_check"}
    assert checks == {("n1", "ecc"), ("n2", "ecc")}  # n1's xid is gone, n2 untouched
    assert series[("jobwrap_node_healthy", (("node", "n1"),))] == 1


def test_off_when_no_textfile_is_configured(tmp_path: Path) -> None:
    assert metrics.record_login_guard(MetricsConfig(), rule="cpu", action="warn") is False
    assert list(tmp_path.iterdir()) == []


def test_label_values_and_help_are_escaped(tmp_path: Path) -> None:
    path = tmp_path / "m.prom"
    odd = 'a "quoted" back\\slash\nnewline'
    metrics.update(str(path), "jobwrap_test", 'help with \\ and\nnewline', "gauge",
                   {labels(reason=odd): 1.5})
    families = list(text_string_to_metric_families(path.read_text()))
    assert families[0].documentation == "help with \\ and\nnewline"
    assert families[0].samples[0].labels == {"reason": odd}
    # Read back by our own parser, merged, and still the same.
    metrics.update(str(path), "jobwrap_test", "h", "gauge", {labels(reason="x"): 2})
    assert _series(path)[("jobwrap_test", (("reason", odd),))] == 1.5


def test_set_add_and_a_changed_type(tmp_path: Path) -> None:
    path = str(tmp_path / "m.prom")
    metrics.update(path, "jobwrap_x", "h", "gauge", {(): 5})
    metrics.update(path, "jobwrap_x", "h", "gauge", {(): 2}, add=True)
    assert _series(Path(path))[("jobwrap_x", ())] == 7
    metrics.update(path, "jobwrap_x", "h", "gauge", {(): 1})
    assert _series(Path(path))[("jobwrap_x", ())] == 1
    metrics.update(path, "jobwrap_x", "h", "untyped", {labels(a=1): 1})
    assert _series(Path(path)) == {("jobwrap_x", (("a", "1"),)): 1}
    assert _types(Path(path)) == {"jobwrap_x": "unknown"}


def test_labels_in_any_order_are_one_series(tmp_path: Path) -> None:
    path = str(tmp_path / "m.prom")
    metrics.update(path, "jobwrap_y_total", "h", "counter", {(("b", "2"), ("a", "1")): 1},
                   add=True)
    metrics.update(path, "jobwrap_y_total", "h", "counter", {(("a", "1"), ("b", "2")): 1},
                   add=True)
    assert _series(Path(path)) == {("jobwrap_y_total", (("a", "1"), ("b", "2"))): 2}


@pytest.mark.parametrize(("family", "pairs"), [
    ("jobwrap bad", ()), ("9lives", ()), ("jobwrap_ok", (("bad-label", "x"),)),
    ("jobwrap_ok", (("__reserved", "x"),)), ("jobwrap_count", ()),
])
def test_bad_names_are_refused(tmp_path: Path, family: str,
                               pairs: tuple[tuple[str, str], ...]) -> None:
    kind = "counter" if family == "jobwrap_count" else "gauge"  # a counter without _total
    with pytest.raises(MetricsError):
        metrics.update(str(tmp_path / "m.prom"), family, "h", kind, {pairs: 1})
    assert not (tmp_path / "m.prom").exists()


def test_foreign_and_broken_lines_survive_or_go(tmp_path: Path) -> None:
    path = tmp_path / "m.prom"
    path.write_text("# HELP other_metric From someone else.\n# TYPE other_metric gauge\n"
                    'other_metric{x="1"} 3 1700000000000\n'
                    "this is not a sample line at all\n"
                    'cut_metric{x="1\n')
    metrics.update(str(path), "jobwrap_z", "h", "gauge", {(): 1})
    series = _series(path)
    assert series[("other_metric", (("x", "1"),))] == 3
    assert ("jobwrap_z", ()) in series
    assert "not a sample" not in path.read_text()


def test_an_update_parses_only_the_families_it_changes(tmp_path: Path) -> None:
    """Another hook's series are checked and written back as they were (the prolog's
    health update must not pay for the whole file); a line that is not a sample goes
    whichever family it would belong to, and the changed family is merged as before."""
    path = tmp_path / "m.prom"
    odd = 'other{b="2",a="1 \\"q\\""} 1.5e+03 1700000000000'  # escapes, unsorted, stamped
    path.write_text("# HELP other From someone else.\n# TYPE other gauge\n"
                    f"{odd}\nother{{a=\"1\"b=\"2\"}} 4\nother 5 x y\n"
                    "# TYPE jobwrap_w gauge\njobwrap_w{a=\"1\"} 2\n")
    metrics.update(str(path), "jobwrap_w", "h", "gauge", {labels(a=1): 3}, add=True)
    text = path.read_text()
    assert odd in text.splitlines()  # kept exactly, not re-rendered
    assert 'a="1"b="2"' not in text and "x y" not in text  # broken lines dropped
    series = _series(path)
    assert series[("jobwrap_w", (("a", "1"),))] == 5
    assert series[("other", (("a", '1 "q"'), ("b", "2")))] == 1500
    assert metrics.parse(text)["other"].samples == metrics.parse(
        text, only={"other"})["other"].samples


def test_written_atomically_and_readable_by_node_exporter(tmp_path: Path) -> None:
    path = tmp_path / "m.prom"
    path.write_text("")
    inode = path.stat().st_ino
    metrics.update(str(path), "jobwrap_a", "h", "gauge", {(): 1})
    assert path.stat().st_ino != inode  # renamed over, never rewritten in place
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.prom", "m.prom.lock"]


def test_a_symlinked_textfile_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "m.prom").symlink_to(target)
    with pytest.raises(MetricsError, match="cannot read"):
        metrics.update(str(tmp_path / "m.prom"), "jobwrap_a", "h", "gauge", {(): 1})
    assert target.read_text() == ""


def test_a_held_lock_times_out_and_the_helper_only_warns(tmp_path: Path) -> None:
    import fcntl

    cfg = MetricsConfig(textfile=str(tmp_path / "m.prom"), lock_timeout=0.2)
    fd = os.open(tmp_path / "m.prom.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(MetricsError, match="held by another writer"):
            metrics.apply(cfg.textfile, [Change("jobwrap_a", "h", "gauge", {(): 1})],
                          lock_timeout=0.2)
        assert metrics.record_login_guard(cfg, rule="cpu", action="warn") is False
    finally:
        os.close(fd)
    assert not (tmp_path / "m.prom").exists()
    assert metrics.record_login_guard(cfg, rule="cpu", action="warn") is True


def _hammer(path: str, worker: int, rounds: int) -> None:
    cfg = MetricsConfig(textfile=path, lock_timeout=30.0)
    for _ in range(rounds):
        assert metrics.record_failure(cfg, "gpu", requeued=True)
        metrics.update(path, f"jobwrap_worker_{worker}", "h", "gauge", {(): worker})


def test_concurrent_updaters_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "m.prom")
    workers, rounds = 6, 25
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_hammer, args=(path, w, rounds)) for w in range(workers)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert [p.exitcode for p in procs] == [0] * workers
    series = _series(Path(path))
    assert series[("jobwrap_restarts_total", (("class", "gpu"),))] == workers * rounds
    assert series[("jobwrap_job_failures_total", (("action", "requeue"),
                                                  ("class", "gpu")))] == workers * rounds
    for w in range(workers):
        assert series[(f"jobwrap_worker_{w}", ())] == w
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def test_goodput_series_add_up_over_attempts(cfg: MetricsConfig) -> None:
    path = Path(cfg.textfile)
    assert metrics.record_goodput(cfg, failure_class="hang", productive_s=20, wall_s=25,
                                  lost_s=5, node="n1")
    assert metrics.record_goodput(cfg, failure_class="success", productive_s=50, wall_s=75,
                                  lost_s=0, gap=("hang", 25.0), ended_ettr=0.7, node="n1")
    series = _series(path)
    node = (("node", "n1"),)
    assert series[("jobwrap_goodput_productive_seconds_total", node)] == 70
    assert series[("jobwrap_goodput_wall_seconds_total", node)] == 100
    assert series[("jobwrap_lost_seconds_total", (("class", "hang"), *node))] == 5
    assert ("jobwrap_lost_seconds_total", (("class", "success"), *node)) not in series
    assert series[("jobwrap_restart_gap_seconds_total", (("class", "hang"), *node))] == 25
    assert series[("jobwrap_restart_gaps_total", (("class", "hang"), *node))] == 1
    assert series[("jobwrap_jobs_ended_total", node)] == 1
    assert series[("jobwrap_jobs_ettr_sum_total", node)] == 0.7
    assert series[("jobwrap_job_last_ettr", node)] == 0.7
