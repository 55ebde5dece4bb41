"""The job's user forges its goodput: checkpoint claims with absurd times and steps, and an
``attempt.end`` of its own. Root's epilog still ends every attempt, the AdminComment says
only what root decided (and numbers only the attempts root ran: issue 22, item 6), the
metrics stay a valid textfile with finite numbers, and
``jobwrap status`` keeps ETTR within [0, 1], the restarts in place it claims (jobwrap
run's boundaries) bounded and kept apart from root's verdicts. Played on the real sandbox
Slurm by the test user's own job."""

from __future__ import annotations

import json
import math

from prometheus_client.parser import text_string_to_metric_families

from jobwrap_dev.sandbox.cluster import Cluster
from wrapper.runner import Runner

FORGE = r"""#!/bin/bash
#SBATCH --output={work}/forge-goodput-%j.out
#JOBWRAP --max-restarts=1
events={state}/jobs/$SLURM_JOB_ID/user-events.jsonl
forge() {{
  printf '{{"event":"%s","attempt":%s,"hook":"supervisor",%s}}\n' \
    "$1" "$JOBWRAP_ATTEMPT" "$2" >> "$events"
}}
forge checkpoint '"ts":1e999,"step":5,"path":"/x"'
forge checkpoint '"ts":NaN,"step":"many","path":"/y"'
forge checkpoint '"ts":-1e300,"step":-7,"path":"/z","save_s":1e308'
forge checkpoint '"ts":"soon","step":1e400,"path":"/w"'
forge attempt.end '"ts":1,"kind":"success","decision":"done","node":"n1"'
# issue 22, item 6: attempts root never ran, which once filled the ledger and pushed
# root's own a0 out of the AdminComment
for a in $(seq 52 119); do
  printf '{{"event":"supervisor.start","attempt":%s,"ts":%s,"node":"n1"}}\n' \
    "$a" "$(date +%s)" >> "$events"
done
# restarts inside the allocation it never made, with classes jobwrap run never gives and
# one it does (the ledger's boundaries: jobwrap run's word, bounded, never root's verdict)
for r in $(seq 1 300); do
  forge run.restarted "\"ts\":$(date +%s.%N),\"restart\":$r,\"kind_ended\":\"success\""
done
forge run.restarted "\"ts\":$(date +%s.%N),\"restart\":301,\"kind_ended\":\"hardware\""
exit 1
"""


def test_forged_goodput_claims_do_not_reach_root(cluster: Cluster) -> None:
    job_id = cluster.submit(FORGE.format(work=cluster.work, state=cluster.state_in_script),
                            name="forge-goodput.sh")
    info = cluster.wait_job(job_id, timeout=150)
    output = (cluster.work / f"forge-goodput-{job_id}.out").read_text()
    assert info["JobState"] == "FAILED", output
    root = [e for e in cluster.events(job_id) if e["source"] == "root"]
    ends = [(e["attempt"], e["kind"], e["decision"]) for e in root
            if e["event"] == "attempt.end"]
    assert ends == [(0, "user_error", "requeue"), (1, "user_error", "stop")], (ends, output)
    assert {e["attempt"] for e in root if e["event"] == "archive"} == {0, 1}

    # Slurm's own record: root's words for attempt 0 (the forged "success" is not there)
    comment = cluster.job(job_id).get("AdminComment", "")
    assert comment.startswith("jobwrap: a0=user_error/requeue"), comment
    assert "success" not in comment

    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for prom in cluster.metrics_texts()
               for f in text_string_to_metric_families(prom) for s in f.samples}
    goodput = {k: v for k, v in samples.items() if k[0].startswith("jobwrap_goodput_")}
    assert goodput and all(math.isfinite(v) and v >= 0 for v in goodput.values()), goodput

    env = {**cluster.env(), "JOBWRAP_CONFIG": str(cluster.jobwrap_config)}
    out = Runner(env).run([str(cluster.runtime / "venv" / "bin" / "jobwrap"), "status",
                           job_id, "--json"], timeout=60).stdout
    ledger = json.loads(out)["goodput"]
    assert 0 <= ledger["ettr"] <= 1 and ledger["lost_s"] <= ledger["wall_s"], ledger
    assert [a["kind"] for a in ledger["attempts"] if not a["in_place"]] == \
        ["user_error", "user_error"], ledger
    claimed = [a["kind"] for a in ledger["attempts"] if a["in_place"]]
    assert 0 < len(claimed) <= 2 * 100 and set(claimed) <= {"unknown", "hardware"}, claimed
    assert [a["attempt"] for a in json.loads(out)["attempts"]] == [0, 1], out
    assert "a52=" not in comment and "a119=" not in comment, comment
