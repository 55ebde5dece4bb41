"""Mid-run faults on any node of a multi-node job: the node's root watcher sees them.

A real 2-node job runs the toy training loop as the test user; an Xid is written into
n2's fake GPU inventory while it runs. n2's watcher (root, started by n2's prolog) must
end the job within 2 x gpu_interval, n2 must be drained with the Xid in its reason, and
the first node's decision must class the attempt ``hardware``, exclude n2 and requeue:
the job resumes on the two healthy nodes from its checkpoint.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import jobwrap_dev.sandbox
from jobwrap_dev.sandbox.cluster import Cluster
from wrapper import config
from wrapper.runner import Runner
from wrapper.slurm.parse import expand_hostlist

STEPS = 30
EXPECTED = STEPS * (STEPS + 1) // 2
PAYLOAD = Path(jobwrap_dev.sandbox.__file__).parent / "toy_train.py"


def scontrol(cluster: Cluster, *args: str) -> str:
    return Runner(cluster.env()).run(["scontrol", *args], timeout=20).stdout


def test_xid_on_second_node_ends_the_job_drains_it_and_resumes_elsewhere(
        cluster: Cluster) -> None:
    cluster.write_user_file("train.py", PAYLOAD.read_text())
    shutil.rmtree(cluster.work / "ckpt-xid", ignore_errors=True)
    interval = config.load(str(cluster.jobwrap_config)).supervisor.gpu_interval
    job_id = cluster.submit(f"""#!/bin/bash
#SBATCH --nodes=2 --gres=gpu:1 --output=xid-%j.out --open-mode=append
#JOBWRAP --checkpoint-dir=ckpt-xid --max-restarts=3
python3 train.py {STEPS} 0.5
""", name="xid.sh")
    bad = ""  # the job's second node: whichever two nodes were idle, it is the later
    try:
        cluster.wait_job(job_id, states={"RUNNING"}, timeout=60)
        first = cluster.job(job_id)
        nodes = expand_hostlist(first["NodeList"])
        assert len(nodes) == 2, first
        bad = nodes[1]
        deadline = time.monotonic() + 60
        while not list((cluster.work / "ckpt-xid").glob("epoch=0-step=3.ckpt")):
            assert time.monotonic() < deadline, "the job made no checkpoint"
            time.sleep(0.2)
        written, written_at = time.monotonic(), time.time()
        cluster.set_gpu_faults(bad, {m: {"xid_events": (79,)} for m in range(4)})
        while cluster.job(job_id).get("JobState") == "RUNNING" and \
                time.monotonic() - written < 60:
            time.sleep(0.1)
        # When the job was ended: root's record of it (written once Slurm took the
        # signal), not this poll, which a loaded machine's scontrol can delay by seconds.
        ended = [e["ts"] for e in cluster.events(job_id)
                 if e["event"] == "watch.ended_job" and e["source"] == "root"]
        assert len(ended) == 1, (ended, time.monotonic() - written)
        ended_after = ended[0] - written_at
        assert 0 < ended_after <= 2 * interval, (ended_after, interval)

        info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED", "CANCELLED"},
                                timeout=150)
        output = (cluster.work / f"xid-{job_id}.out").read_text()
        assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, output)
        assert f"done sum {EXPECTED}" in output, output
        assert "attempt=1 resume=" in output and "start=0" not in output.split(
            "attempt=1")[1], output
        resumed_on = expand_hostlist(info["NodeList"])
        assert len(resumed_on) == 2 and bad not in resumed_on, info
        node = scontrol(cluster, "-o", "show", "node", bad)
        assert "DRAIN" in node and "Reason=jobwrap: xid gpu0" in node and "79" in node, node
        events = cluster.events(job_id)
        ends = [(e["attempt"], e["kind"], e["decision"], e["exclude"]) for e in events
                if e["event"] == "attempt.end" and e["source"] == "root"]
        assert ends == [(0, "hardware", "requeue", [bad]), (1, "success", "done", [])], ends
        faults = [e for e in events if e["event"] == "watch.fault" and e["source"] == "root"]
        assert [(f["node"], f["attempt"]) for f in faults] == [(bad, 0)], faults
        assert "jobwrap: attempt 0 ended: hardware" in output, output
    finally:
        if bad:
            cluster.set_gpu_faults(bad)
            scontrol(cluster, "update", f"NodeName={bad}", "State=RESUME")
        Runner(cluster.env()).run(["scancel", job_id], timeout=20, check=False)
    # every watcher of the job has ended (the epilogs stopped them; root's epilog.context
    # of their attempt ends them too). Other tests' jobs may still be ending: not counted.
    deadline = time.monotonic() + 60
    while left := [p.cmdline() for p in cluster.runtime_processes()
                   if "wrapper.watch" in p.cmdline() and job_id in p.cmdline()]:
        assert time.monotonic() < deadline, ("a watcher outlived its job", left, [
            (e["event"], e.get("node"), e.get("attempt"))
            for e in cluster.events(job_id)
            if e["source"] == "root" and e["event"].split(".")[0] in ("prolog", "epilog",
                                                                      "watch")])
        time.sleep(0.3)


def test_a_job_cancelled_while_it_runs_is_classed_cancelled_and_stays_stopped(
        cluster: Cluster) -> None:
    """scancel while the batch script runs: Slurm hands the epilog exit 0 and a record that
    says COMPLETING. The attempt is ``cancelled`` (it was ``success``), and not requeued."""
    job_id = cluster.submit("#!/bin/bash\n#SBATCH --output=cancel-%j.out\n"
                            "echo started\nsleep 300\n", name="cancel.sh")
    out = cluster.work / f"cancel-{job_id}.out"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (out.exists() and "started" in out.read_text()):
        time.sleep(0.3)
    assert "started" in out.read_text()
    cluster.as_user(["scancel", job_id])
    info = cluster.wait_job(job_id, states={"CANCELLED", "COMPLETED", "FAILED"}, timeout=60)
    assert info["JobState"] == "CANCELLED" and info["Restarts"] == "0", info
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not [
            e for e in cluster.events(job_id)
            if e["event"] == "attempt.end"]:
        time.sleep(0.3)
    ends = [(e["attempt"], e["kind"], e["decision"])
            for e in cluster.events(job_id)
            if e["event"] == "attempt.end" and e["source"] == "root"]
    assert ends == [(0, "cancelled", "stop")], (ends, out.read_text())
