"""The Grafana dashboard (grafana/jobwrap.json) against a real Prometheus: every panel's
query returns data from jobwrap's textfile, exported by a real node_exporter.

Both run on loopback from a temporary folder, started and stopped (by pid) here; the
textfile is written by jobwrap's own metrics helpers, as the hooks write it.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sandbox import free_ports
from wrapper import metrics
from wrapper.config import MetricsConfig

DASHBOARD = Path(__file__).resolve().parents[2] / "grafana" / "jobwrap.json"
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}


def _program(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if not found:
        pytest.fail(f"{name} is not installed: run `bash tools/bootstrap` (Debian package "
                    f"{name})", pytrace=False)
    return found


def _get(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback
        data: dict[str, object] = json.loads(response.read())
    return data


def _query(base: str, expr: str) -> list[dict[str, object]]:
    data = _get(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
    assert data["status"] == "success", data
    result = data["data"]["result"]  # type: ignore[index]
    assert isinstance(result, list)
    return result


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[str]:
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    cfg = MetricsConfig(textfile=str(textdir / "jobwrap.prom"))
    metrics.record_node_health(cfg, [("ecc", "0", "pass")], node="n1")
    metrics.record_node_health(cfg, [("ecc", "0", "fail")], node="n2")
    metrics.record_failure(cfg, "hardware", requeued=True, node="n2")
    metrics.record_failure(cfg, "user_error", requeued=False, node="n1")
    metrics.record_goodput(cfg, failure_class="hardware", productive_s=20, wall_s=25,
                           lost_s=5, node="n2")
    metrics.record_goodput(cfg, failure_class="success", productive_s=50, wall_s=75,
                           lost_s=0, gap=("hardware", 25.0), ended_ettr=0.7, node="n1")
    exporter_port, prom_port = free_ports(2)
    (tmp_path / "prometheus.yml").write_text(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: node
    static_configs:
      - targets: ["127.0.0.1:{exporter_port}"]
""")
    procs = []
    try:
        procs.append(subprocess.Popen(
            [_program("prometheus-node-exporter"), "--collector.disable-defaults",
             "--collector.textfile", f"--collector.textfile.directory={textdir}",
             f"--web.listen-address=127.0.0.1:{exporter_port}"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "exporter.log", "wb")))  # noqa: SIM115
        procs.append(subprocess.Popen(
            [_program("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb")))  # noqa: SIM115
        base = f"http://127.0.0.1:{prom_port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if _query(base, 'count_over_time(jobwrap_job_failures_total[1m]) >= 3'):
                    break  # three scrapes: rates and increases have data
            except OSError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("Prometheus did not scrape the textfile in 60 s; see "
                        f"{tmp_path}/prometheus.log and exporter.log")
        yield base
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_every_panel_query_returns_data(prometheus: str) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(name, value)
            result = _query(prometheus, expr)
            assert result, f"panel {panel['title']!r}: {expr} returned nothing"
            values = [float(r["value"][1]) for r in result]  # type: ignore[index]
            assert not any(math.isnan(v) for v in values), (panel["title"], values)


def test_the_numbers_are_the_ledgers(prometheus: str) -> None:
    [ettr] = _query(prometheus, "sum(jobwrap_goodput_productive_seconds_total) / "
                                "sum(jobwrap_goodput_wall_seconds_total)")
    assert float(ettr["value"][1]) == pytest.approx(0.7)  # type: ignore[index]
    [drained] = _query(prometheus, "sum(1 - jobwrap_node_healthy)")
    assert float(drained["value"][1]) == 1  # type: ignore[index]
    [flaky] = _query(prometheus, 'topk(1, sum by (node) (jobwrap_job_failures_total'
                                 '{class=~"hardware|node_failure|hang|nccl_timeout"}))')
    assert flaky["metric"] == {"node": "n2"}  # type: ignore[index]
