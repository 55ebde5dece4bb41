"""``jobwrap install`` and ``uninstall`` on the sandbox, as an admin runs them on a host that
is the controller and every node: the sandbox itself is installed by them (its slurm.conf
is written bare, the site's lines only). Taken out, slurm.conf and the sandbox's etc/ are
byte for byte what they were before jobwrap and jobs run without it; put back, a job goes
through every hook and job_submit.lua refuses a bad directive; a second install changes
nothing; taken out again, everything is as bare as before."""

from __future__ import annotations

import hashlib
import json

import pytest

from jobwrap_dev.sandbox.cluster import Cluster
from jobwrap_dev.sandbox.daemons import alive
from tests.support.restarts import restart_slurmd
from wrapper.runner import Runner

JOB = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --output=inst-%j.out
srun bash -c 'echo "$SLURMD_NODENAME scratch=${JOBWRAP_SCRATCH:-none}"'
"""


def _snapshot(cluster: Cluster) -> dict[str, str]:
    """Every file of the sandbox's etc/ and of the runtime (its venv aside) by content."""
    out = {}
    for root in (cluster.base / "etc", cluster.runtime):
        for path in sorted(root.rglob("*")):
            if "venv" in path.relative_to(cluster.runtime if root == cluster.runtime
                                          else root).parts[:1] or path.name == "install.json":
                continue
            out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest() \
                if path.is_file() else "dir"
    return out


def _restart(cluster: Cluster) -> None:
    """Slurm reads its hooks' lines at start: the controller, then every slurmd."""
    cluster.stop_daemon("slurmctld")
    cluster.start_daemon("slurmctld")
    restart_slurmd(cluster, list(cluster.spec.nodes))
    cluster.wait_idle(timeout=60)


def _run(cluster: Cluster) -> tuple[str, list[str]]:
    job_id = cluster.submit(JOB, name="inst.sh")
    info = cluster.wait_job(job_id, timeout=120)
    assert info["JobState"] == "COMPLETED", info
    lines = (cluster.work / f"inst-{job_id}.out").read_text().split("\n")
    return job_id, sorted(line for line in lines if line)


def test_uninstall_then_install_on_the_sandbox(cluster: Cluster) -> None:
    record = json.loads((cluster.runtime / "install.json").read_text())
    bare_conf = next(e["before"] for e in record["files"] if e["path"] == str(cluster.conf))
    assert "Prolog=" not in bare_conf and "JobSubmitPlugins" not in bare_conf
    installed = _snapshot(cluster)
    lua = cluster.conf.parent / "job_submit.lua"
    scontrol = ["scontrol", "update", "NodeName=n3"]
    Runner(cluster.env()).run([*scontrol, "State=DRAIN", "Reason=jobwrap: test fault"],
                              timeout=20)
    try:
        said = cluster.install_jobwrap("uninstall")
        assert "drained by jobwrap (they stay drained: `scontrol update NodeName=... " \
               "State=RESUME` once fixed): n3\n" in said, said
        assert cluster.node_states()["n3"].startswith("drain")  # its fault is real: kept
        Runner(cluster.env()).run([*scontrol, "State=RESUME"], timeout=20)
        assert cluster.conf.read_text() == bare_conf
        assert not lua.exists() and not (cluster.runtime / "prolog").exists()
        assert not (cluster.base / "etc" / "systemd").exists()
        bare = _snapshot(cluster)
        _restart(cluster)
        job_id, lines = _run(cluster)  # Slurm alone: no hook, no export, no event
        assert all(line.endswith("scratch=none") for line in lines), lines
        assert cluster.events(job_id) == []

        said = cluster.install_jobwrap("install")
        assert f"wrote {cluster.conf} (slurm.conf's lines)" in said, said
        assert f"wrote {lua} (job_submit.lua)" in said
        assert "nothing to change" in cluster.install_jobwrap("install")
        _restart(cluster)
        job_id, lines = _run(cluster)
        assert len(lines) == 2 and all(f"scratch={cluster.base}/nodes/" in line
                                       for line in lines), lines
        hooks = {e["context"]["hook"] for e in cluster.events(job_id)
                 if e["event"].endswith(".context")}
        assert hooks == {"prolog", "task-prolog", "epilog"}, hooks
        bad = cluster.write_user_file("bad.sh", "#!/bin/bash\n#JOBWRAP --max-restarts=lots\n"
                                      "true\n", 0o755)
        refused = cluster.as_user(["sbatch", str(bad)], check=False)
        assert refused.returncode != 0 and "max-restarts" in refused.stderr, refused

        said = cluster.install_jobwrap("uninstall")
        assert "no node is drained with a jobwrap: reason" in said, said
        assert _snapshot(cluster) == bare and cluster.conf.read_text() == bare_conf
    finally:
        Runner(cluster.env()).run([*scontrol, "State=RESUME"], timeout=20, check=False)
        if not (cluster.runtime / "install.json").exists():
            cluster.install_jobwrap("install")
        _restart(cluster)
    assert _snapshot(cluster) == installed
    assert all(alive(d) for d in cluster.daemons)


@pytest.fixture(autouse=True)
def _quiet_queue(cluster: Cluster) -> None:
    cluster.wait_idle(timeout=120)
