"""The admin's side on the real cluster: submit-time checks, requeue defaults, the walltime
signal, doctor, and the metrics textfile."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobwrap_dev.sandbox.cluster import Cluster
from jobwrap_dev.sandbox.daemons import SandboxError


def jobwrap(cluster: Cluster, *args: str, config: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(cluster.runtime / "venv" / "bin" / "jobwrap"), "--config",
                           str(config or cluster.jobwrap_config), *args], capture_output=True,
                          text=True, env=cluster.env(), timeout=60, check=False)


def test_bad_directive_fails_sbatch_itself(cluster: Cluster) -> None:
    with pytest.raises(SandboxError) as info:
        cluster.submit("#!/bin/bash\n#JOBWRAP --max-restart=3\ntrue\n", name="bad.sh")
    message = str(info.value)
    assert "#JOBWRAP line 2: unknown option '--max-restart'" in message
    assert "valid options: --checkpoint-dir" in message


@pytest.mark.parametrize(("script_line", "args", "requeue"), [
    ("", (), "1"),
    ("#JOBWRAP --no-requeue", (), "0"),
    ("", ("--no-requeue",), "0"),
])
def test_requeue_default_and_the_users_no(cluster: Cluster, script_line: str,
                                           args: tuple[str, ...], requeue: str) -> None:
    job_id = cluster.submit(f"#!/bin/bash\n{script_line}\ntrue\n", "--hold", *args,
                            name="rq.sh")
    try:
        assert cluster.job(job_id)["Requeue"] == requeue
    finally:
        subprocess.run(["scancel", job_id], env=cluster.env(), check=False)


def test_walltime_signal_reaches_a_job_that_asked_for_none(cluster: Cluster) -> None:
    job_id = cluster.submit(
        "#!/bin/bash\n#SBATCH --time=1\n#SBATCH --output=sig-%j.out\n"
        "srun bash -c 'trap \"echo got URG; exit 0\" URG; for i in $(seq 60); do sleep 0.5;"
        " done'\n", name="sig.sh")
    info = cluster.wait_job(job_id, timeout=90)
    assert info["JobState"] == "COMPLETED", info
    assert "got URG" in (cluster.work / f"sig-{job_id}.out").read_text()
    events = [e for e in cluster.events(job_id)
              if e["event"] == "walltime.signal"]
    assert len(events) == 1 and events[0]["signal"] == "URG"


def test_doctor_passes_on_the_cluster_and_names_each_fix(cluster: Cluster, tmp_path: Path
                                                         ) -> None:
    ok = jobwrap(cluster, "doctor", "--slurm-conf", str(cluster.conf), "--node", "n1")
    assert ok.returncode == 0, ok.stdout + ok.stderr

    def broken_conf(drop: str, name: str) -> Path:
        text = "\n".join(line for line in cluster.conf.read_text().splitlines()
                         if not line.startswith(drop))
        path = cluster.conf.with_name(name)
        path.write_text(text + "\n")
        return path

    no_prolog = jobwrap(cluster, "doctor", "--slurm-conf",
                        str(broken_conf("Prolog=", "noprolog.conf")), "--node", "n1")
    assert no_prolog.returncode == 1 and "Prolog=" in no_prolog.stdout, no_prolog.stdout
    no_nohold = jobwrap(cluster, "doctor", "--slurm-conf",
                        str(broken_conf("SchedulerParameters=", "nohold.conf")), "--node", "n1")
    assert no_nohold.returncode == 1 and "nohold_on_prolog_fail" in no_nohold.stdout

    unsafe = tmp_path / "state"
    unsafe.mkdir()
    unsafe.chmod(0o777)
    config = tmp_path / "jobwrap.toml"
    config.write_text(cluster.jobwrap_config.read_text().replace(
        f'state_dir = "{cluster.base}/nodes/{{node}}/state"', f'state_dir = "{unsafe}"'))
    bad_state = jobwrap(cluster, "doctor", "--slurm-conf", str(cluster.conf), "--node", "n1",
                        config=config)
    assert bad_state.returncode == 1 and str(unsafe) in bad_state.stdout, bad_state.stdout
    assert "chmod" in bad_state.stdout

    invalid = tmp_path / "invalid.toml"
    invalid.write_text("[checks]\necc = 'yes'\n")
    bad_config = jobwrap(cluster, "doctor", "--slurm-conf", str(cluster.conf), "--node", "n1",
                         config=invalid)
    assert bad_config.returncode in (1, 2) and "[checks] ecc" in (bad_config.stdout +
                                                                  bad_config.stderr)


def test_metrics_textfile_after_jobs(cluster: Cluster) -> None:
    job_id = cluster.submit("#!/bin/bash\nexit 0\n", "--gres=gpu:1", "-w", "n1",
                            name="m.sh")
    cluster.wait_job(job_id)
    text = cluster.metrics_of("n1").read_text()  # n1's own, as node_exporter reads it
    families = {f.name: f for f in text_string_to_metric_families(text)}
    healthy = [s for s in families["jobwrap_node_healthy"].samples]
    assert {s.labels.get("node") for s in healthy} >= {"n1"} and all(s.value == 1 for s in
                                                                       healthy)
    checks = families["jobwrap_node_check"].samples
    assert any(s.labels["check"] == "ecc" and s.labels["verdict"] == "pass" for s in checks)
    # failures recorded by earlier tests' requeues, if any ran first, count by class
    if "jobwrap_job_failures" in families:
        assert all(s.labels["class"] for s in families["jobwrap_job_failures"].samples)
    shutil.copy(cluster.metrics_of("n1"), "/tmp/last-metrics.prom")
