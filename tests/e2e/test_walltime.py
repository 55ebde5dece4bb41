"""The walltime signal reaches a job that runs no srun step: its batch shell gets it."""

from __future__ import annotations

from wrapper.sandbox.cluster import Cluster
from wrapper.state import JobState


def test_a_job_without_steps_gets_the_walltime_signal_in_its_batch_shell(
        cluster: Cluster) -> None:
    job_id = cluster.submit(
        "#!/bin/bash\n#SBATCH --time=1\n#SBATCH --output=nostep-%j.out\n"
        "trap 'echo got URG in the batch shell; exit 0' URG\n"
        "for i in $(seq 120); do sleep 0.5; done\necho never signalled\n", name="nostep.sh")
    info = cluster.wait_job(job_id, timeout=90)
    output = (cluster.work / f"nostep-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED", (info, output)
    assert "got URG in the batch shell" in output and "never signalled" not in output, output
    events = [e for e in JobState(cluster.state_dir, job_id).events()
              if e["event"] == "walltime.signal"]
    assert len(events) == 1 and events[0]["signal"] == "URG", events
