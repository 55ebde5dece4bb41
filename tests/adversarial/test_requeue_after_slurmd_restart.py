"""A user times their own requeue to a slurmd restart (issue 37 item 1).

The first node's epilog once counted a node as lost when its slurmd had started after the
attempt did, whenever the job was requeued without jobwrap. A rolling slurmd restart under
a job, then the job's own ``scontrol requeue`` (or the supervisor's save before the time
limit), and the attempt read ``node_failure``: the node excluded, the job's brakes
skipped, and a node failure in ``jobwrap report`` for every node of the attempt. The
flaky-node list and the MTBF were the user's to steer. A daemon that restarted is no lost
node; only Slurm's own verdict (DOWN, a boot, NODE_FAIL) makes one.
"""

from __future__ import annotations

import pytest

from jobwrap_dev.sandbox.cluster import Cluster
from tests.support import poll
from tests.support.restarts import EXPECTED, last_step, restart_slurmd, start_job, write_payload


@pytest.fixture(scope="module")
def payload(cluster: Cluster) -> str:
    return write_payload(cluster)


@pytest.mark.usefixtures("payload")  # the toy loop, written for the test user
def test_a_job_requeuing_itself_after_a_slurmd_restart_lost_no_node(cluster: Cluster) -> None:
    """slurmd restarted on both nodes under the job (an upgrade), then the job's user
    requeues it (as Lightning's auto-requeue does). Slurm lost no node: the first node's
    epilog must not call the attempt a node failure, nor keep the job off either node."""
    job_id, out, nodes, _procs = start_job(cluster, "restart-requeue")
    restart_slurmd(cluster, nodes)
    step = last_step(out)
    poll("a step after the restart", lambda: last_step(out) > step, 30)
    cluster.as_user(["scontrol", "requeue", job_id])
    info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED", "CANCELLED"}, timeout=120)
    output = out.read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, output)
    events = cluster.events(job_id)
    ends = {e["attempt"]: e for e in events
            if e["event"] == "attempt.end" and e["source"] == "root"}
    assert ends[0]["kind"] != "node_failure", ends[0]
    assert not ends[0].get("exclude"), ends[0]
    assert [e["restarts"] for e in events if e["event"] == "requeue.external"] == [1]
    assert info.get("ExcNodeList", "(null)") in ("", "(null)"), info
    assert ends[1]["kind"] == "success", ends
    assert output.count(f"done sum {EXPECTED}") == 2, output
