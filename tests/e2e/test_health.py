"""GPU health in the prolog and epilog on the real cluster: drain only real faults, precisely."""

from __future__ import annotations

import subprocess
import time

from jobwrap_dev.sandbox.cluster import Cluster
from wrapper.runner import Runner


def scontrol(cluster: Cluster, *args: str) -> str:
    return Runner(cluster.env()).run(["scontrol", *args], timeout=20).stdout


def node_reason(cluster: Cluster, node: str) -> tuple[str, str]:
    out = Runner(cluster.env()).run(["sinfo", "-h", "-N", "-n", node, "-o", "%T|%E"],
                                    timeout=10).stdout.strip()
    state, _, reason = out.partition("|")
    return state, reason


def jobwrap(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(cluster.runtime / "venv" / "bin" / "jobwrap"), "--config",
                           str(cluster.jobwrap_config), *args], capture_output=True, text=True,
                          env=cluster.env(), timeout=60, check=False)


def wait_state(cluster: Cluster, node: str, prefix: str | tuple[str, ...],
               timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state, _ = node_reason(cluster, node)
        if state.startswith(prefix):
            return state
        time.sleep(0.3)
    raise AssertionError(f"{node} is {state}, not {prefix}")


def test_faulty_gpu_drains_its_node_and_the_job_runs_elsewhere(cluster: Cluster) -> None:
    cluster.set_gpu_faults("n1", {0: {"row_remap_failed": True}})
    scontrol(cluster, "update", "NodeName=n2", "State=DRAIN", "Reason=admin: maintenance")
    try:
        job_id = cluster.submit("#!/bin/bash\n#SBATCH --output=health-%j.out\n"
                                "echo ran on $SLURMD_NODENAME\n", "--gres=gpu:1",
                                name="health.sh")
        wait_state(cluster, "n1", "drain")
        _state, reason = node_reason(cluster, "n1")
        assert reason.startswith("jobwrap: row_remap gpu0(GPU-"), reason
        assert "remap" in reason
        # the job went back to the queue, not held; it runs once a healthy node is free
        scontrol(cluster, "update", "NodeName=n2", "State=RESUME")
        info = cluster.wait_job(job_id, timeout=90)
        assert info["JobState"] == "COMPLETED", info
        banner, ran = (cluster.work / f"health-{job_id}.out").read_text().splitlines()
        assert ran == "ran on n2"
        assert banner.startswith("jobwrap: attempt 1 after node n1 failed its health check "
                                 "(jobwrap: row_remap gpu0(GPU-"), banner
        events = cluster.events(job_id)
        unhealthy = [e for e in events if e["event"] == "prolog.unhealthy"]
        assert unhealthy and unhealthy[0]["node"] == "n1"

        # fixed: --resume returns n1 to service (its reason carries jobwrap's prefix)
        still = jobwrap(cluster, "check", "--resume", "--node", "n1")
        assert still.returncode == 1, still.stdout + still.stderr  # fault not cleared yet
        assert node_reason(cluster, "n1")[0].startswith("drain")
        cluster.set_gpu_faults("n1")
        # the shipped HealthCheckProgram, as slurmd runs it: no arguments, a bare
        # environment but SLURMD_NODENAME; it finds jobwrap and its config as the hooks do
        res = subprocess.run([str(cluster.runtime / "prolog" / "healthcheck")],
                             env={"SLURMD_NODENAME": "n1"}, capture_output=True, text=True,
                             timeout=60, check=False)
        assert res.returncode == 0, res.stdout + res.stderr
        # back in service: idle, or already running a job the queue held (seen on 25.11)
        wait_state(cluster, "n1", ("idle", "mixed", "allocated"))

        # a node an admin drained by hand stays drained, healthy or not
        scontrol(cluster, "update", "NodeName=n2", "State=DRAIN", "Reason=admin: cabling")
        res = jobwrap(cluster, "check", "--resume", "--node", "n2")
        # draining while the job that ran there still completes, drained after
        state, reason = node_reason(cluster, "n2")
        assert state.startswith("drain") and reason == "admin: cabling", (state, res.stdout)
    finally:
        cluster.set_gpu_faults("n1")
        for node in ("n1", "n2"):  # whatever state the test left them in
            Runner(cluster.env()).run(["scontrol", "update", f"NodeName={node}",
                                       "State=RESUME"], timeout=20, check=False)
        cluster.wait_idle(timeout=30)


def test_healthy_cluster_runs_with_no_drain(cluster: Cluster) -> None:
    job_id = cluster.submit("#!/bin/bash\ntrue\n", "-N2", "--gres=gpu:4", name="fine.sh")
    assert cluster.wait_job(job_id)["JobState"] == "COMPLETED"
    health = [e for e in cluster.events(job_id) if e["event"] == "health"]
    nodes = sorted({e["node"] for e in health})  # the two of the three it ran on
    assert len(nodes) == 2, health
    assert sorted((e["node"], e["phase"], e["verdict"]) for e in health) == [
        (node, phase, "pass") for node in nodes for phase in ("epilog", "prolog")]
    assert set(cluster.node_states().values()) == {"idle"}


def test_bad_config_is_exit_2_and_no_drain(cluster: Cluster, tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path_factory.mktemp("cfg") / "bad.toml"
    bad.write_text("[checks]\necc = 'yes'\n")
    res = subprocess.run([str(cluster.runtime / "venv" / "bin" / "jobwrap"), "--config",
                          str(bad), "check", "all", "--node", "n1"], capture_output=True,
                         text=True, env=cluster.env(), check=False)
    assert res.returncode == 2
    assert "[checks] ecc" in res.stderr and "Traceback" not in res.stderr
    assert set(cluster.node_states().values()) == {"idle"}
