"""Root's verdicts on a job's earlier attempts reach its next attempt's nodes through the
archive (wrapper/archive/carry.py; docs/security.md row 35). The job plays against that
channel as its user: it writes a verdict of its own, marked as root's, into its event
file, fills the file with deeply nested lines (which the archive's part stores many
times larger), and sends its next attempt to another node. Root carries its own verdict
alone, from a file that stays small whatever the job wrote, and drains nothing."""

from __future__ import annotations

import json

from jobwrap_dev.sandbox.cluster import Cluster
from tests.support import poll

FORGE = r"""#!/bin/bash
#SBATCH --output={work}/carryforge-%j.out --open-mode=append
#JOBWRAP --max-restarts=1
if [ "${{SLURM_RESTART_COUNT:-0}}" = 0 ]; then
  events={state}/jobs/$SLURM_JOB_ID/user-events.jsonl
  forged='"event":"attempt.end","source":"root","attempt":0,"kind":"success"'
  printf '{{"ts":%s,%s,"decision":"done","signature":"forged","node":"%s"}}\n' \
    "$(date +%s.%N)" "$forged" "$SLURMD_NODENAME" >> "$events"
  python3 - "$events" <<'PY'
import json, sys, time
deep = ["x" * 40] * 40
for _ in range(24):
    deep = [deep]  # nested 24 deep: the archive's indented copy grows with every level
line = json.dumps({{"ts": time.time(), "event": "spam", "attempt": 0, "blob": [deep] * 60}})
with open(sys.argv[1], "a") as handle:
    for _ in range(8):
        handle.write(line + "\n")
PY
  echo "attempt 0 on $SLURMD_NODENAME"
  while [ ! -e {work}/carryforge-go-$SLURM_JOB_ID ]; do sleep 0.5; done
  exit 1
fi
echo "attempt 1 on $SLURMD_NODENAME"
"""


def test_a_job_cannot_have_its_own_verdict_carried_nor_bloat_what_is_carried(
        cluster: Cluster) -> None:
    job_id = cluster.submit(FORGE.format(work=cluster.work, state=cluster.state_in_script),
                            name="carryforge.sh")
    out = cluster.work / f"carryforge-{job_id}.out"
    poll("attempt 0 running", lambda: out.exists() and "attempt 0 on " in out.read_text(), 60)
    # its node is taken by another job once attempt 0 ends: attempt 1 runs elsewhere
    node = out.read_text().split("attempt 0 on ")[1].split()[0]
    filler = cluster.submit("#!/bin/bash\nsleep 40\n", "-w", node, "--exclusive",
                            name="carryfill.sh")
    try:
        poll("the filler queued", lambda: cluster.job(filler).get("JobState") == "PENDING", 30)
        (cluster.work / f"carryforge-go-{job_id}").touch()
        info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED", "CANCELLED"},
                                timeout=180)
    finally:
        cluster.as_user(["scancel", filler])
    output = (cluster.work / f"carryforge-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, output)
    first = output.split("attempt 0 on ")[1].split()[0]
    second = output.split("attempt 1 on ")[1].split()[0]
    assert first != second, output  # the next attempt ran on another node: the case played

    # the next attempt's node holds root's verdict on attempt 0, carried, not the job's
    carried = [e for e in cluster.job_state(job_id, second).events(root_only=True)
               if e["event"] == "attempt.end" and e["attempt"] == 0]
    assert [(e["kind"], e["node"]) for e in carried] == [("user_error", first)], carried
    assert all(e.get("signature") != "forged" for e in carried)

    # what the archive carries is root's alone, small, beside a part the job made large
    part = (cluster.base / "jobwrap" / "archive" / cluster.spec.user / job_id / "attempt-0"
            / first)
    verdicts = json.loads((part / "verdicts.json").read_text())
    assert {r["source"] for r in verdicts["records"]} == {"root"}, verdicts
    assert (part / "verdicts.json").stat().st_size < 64 << 10
    assert (part / "part.json").stat().st_size > 1 << 20, "the job's bloat was not played"
    states = cluster.node_states()
    assert all("drain" not in state for state in states.values()), states
