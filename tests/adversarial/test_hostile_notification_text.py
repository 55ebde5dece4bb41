"""The job's own words reach the operators' channel only as inert, bounded data (issue 22,
item 8).

A decision's reason quotes the job's output (its last error line). Played on today's main
before this fix, a job whose error carried ESC/CR, chat mention markup (``<@here>``,
``@everyone``) and a forged "jobwrap: node gpu07 drained" made the notification a page
for everyone with a line jobwrap never wrote.
"""

from __future__ import annotations

import time

from jobwrap_dev.sandbox.cluster import Cluster

JOB = r"""#!/bin/bash
#SBATCH --output=notify-%j.out
#JOBWRAP --max-restarts=2
python3 -c "raise ValueError('<@here> @everyone\u202ejobwrap: node gpu07 drained'
                              '\x1b[2J\x07' + 'x' * 5000)"
"""


def test_notifications_carry_the_jobs_words_as_inert_bounded_data(cluster: Cluster) -> None:
    told = cluster.base / "jobwrap" / "notify-adversarial.log"
    original = cluster.jobwrap_config.read_text()
    cluster.jobwrap_config.write_text(
        original + f'\n[notify]\ncommand = ["/bin/sh", "-c", "cat >> {told}"]\n'
        "rate_limit = 100000\n")
    try:
        job_id = cluster.submit(JOB, name="notify.sh")
        info = cluster.wait_job(job_id, timeout=120)
        deadline = time.monotonic() + 30
        mine: list[str] = []
        while time.monotonic() < deadline and len(mine) < 2:
            text = told.read_text(errors="replace") if told.exists() else ""
            mine = [line for line in text.splitlines() if f"job {job_id} " in line]
            time.sleep(0.5)
    finally:
        cluster.jobwrap_config.write_text(original)
    assert info["JobState"] == "FAILED", info
    # one line each (requeue, then stop): nothing the job printed starts a line
    assert len(mine) == 2, text
    assert "requeued after user_error" in mine[0] and \
        "stopped (not requeued) after user_error" in mine[1], mine
    for line in mine:
        assert "\x1b" not in line and "\r" not in line and "\u202e" not in line, repr(line)
        assert "<@here>" not in line and "@everyone" not in line, line
        assert len(line) < 1000, len(line)
        # the job's words are there, as quoted data after root's own
        assert ': "' in line and "node gpu07 drained" in line.split(': "', 1)[1], line
    assert not any(line.startswith("jobwrap: node") for line in text.splitlines()), text
