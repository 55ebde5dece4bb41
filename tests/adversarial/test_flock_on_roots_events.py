"""A second job of the same user cannot hold a lock root waits on (issue 22, item 3).

The job's user reads root's ``events.jsonl`` through an ACL; ``flock`` needs only a
descriptor open for reading. Played on today's main before this fix, a second job that
held ``LOCK_EX`` on the first job's root file made every root append give up after 5 s:
the epilog failed before its decision, archive and cleanup. Root's appends now lock a
file only root can open.
"""

from __future__ import annotations

import time

from jobwrap_dev.sandbox.cluster import Cluster

VICTIM = """#!/bin/bash
#SBATCH --output={work}/lockv-%j.out
#JOBWRAP --max-restarts=0
while [ ! -e {work}/lock-held-$SLURM_JOB_ID ]; do sleep 0.5; done
echo kept > "$JOBWRAP_SCRATCH/file"
exit 1
"""

LOCKER = """#!/bin/bash
#SBATCH --output={work}/lockl-%j.out
python3 - <<'EOF'
import fcntl, os, time
held = []
for name in ("events.jsonl", "supervisor-facts.jsonl", ".events.lock"):
    try:
        fd = os.open("{state}/jobs/{victim}/" + name, os.O_RDONLY | os.O_NONBLOCK)
        fcntl.flock(fd, fcntl.LOCK_EX)
        held.append(name)
    except OSError as exc:
        print("cannot", name, exc, flush=True)
print("holding", held, flush=True)
open("{work}/lock-held-{victim}", "w").close()
time.sleep(300)
EOF
"""


def test_a_users_flock_on_roots_events_stalls_no_root_append(cluster: Cluster) -> None:
    victim = cluster.submit(VICTIM.format(work=cluster.work), name="lockv.sh")
    node = cluster.wait_job(victim, states={"RUNNING"}, timeout=60)["NodeList"]
    deadline = time.monotonic() + 30
    state = cluster.job_state(victim, node)
    while not (state.path / "events.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    # on the victim's node, where its state folder is
    locker = cluster.submit(LOCKER.format(work=cluster.work, state=cluster.state_of(node),
                                          victim=victim), f"--nodelist={node}",
                            name="lockl.sh")
    try:
        info = cluster.wait_job(victim, timeout=150)
        held = (cluster.work / f"lockl-{locker}.out").read_text()
    finally:
        cluster.as_user(["scancel", locker])
    # the attack ran: the user really held a flock on root's record while root wrote it
    assert "holding ['events.jsonl'" in held, held
    assert "cannot .events.lock" in held, held
    assert info["JobState"] == "FAILED", info
    events = [e for e in state.events() if e["source"] == "root"]
    ends = [(e["attempt"], e["kind"]) for e in events if e["event"] == "attempt.end"]
    assert ends == [(0, "user_error")], events
    assert {e["attempt"] for e in events if e["event"] == "archive"} == {0}, events
    assert {e["attempt"] for e in events if e["event"] == "scratch.removed"} == {0}, events
    assert "drain" not in " ".join(cluster.node_states().values())
