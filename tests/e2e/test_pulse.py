"""The pulse on the sandbox (wrapper/pulse/): what is not a lost node, and the fence.

Slurm runs SlurmdTimeout=300 here as at sites; the pulse runs its defaults (a beat each
0.5 s, lost after 4.5 s of silence). A node whose watcher freezes 3 s, or whose job
starves its CPUs, keeps its place; a node cut off from the hub stops the job's work on
itself, and nothing of the job writes there after that fence. The lost node itself (the
spare takes over in seconds) is tests/e2e/test_spares.py's."""

from __future__ import annotations

import contextlib
import json
import signal
import time

import psutil

from jobwrap_dev.sandbox.cluster import Cluster
from wrapper.runner import Runner

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT"}

# Each rank writes the time every 50 ms to ticks-<job>-<rank>; the rank on the second node
# starts HOGS busy processes (the job's own) from HOG_AT to HOG_AT + HOG_FOR seconds.
RANK = r"""
import os, subprocess, sys, time
end = time.time() + float(sys.argv[1])
rank = os.environ["SLURM_PROCID"]
hogs = []
with open(f"ticks-{os.environ['SLURM_JOB_ID']}-{rank}", "a") as ticks:
    start = time.time()
    while time.time() < end:
        ticks.write(f"{time.time():.6f}\n")  # finer than the event's clock reading
        ticks.flush()
        if int(time.time() * 20) % 20 == 0:  # the job's output grows: no hang
            print(f"rank {rank} at {time.time():.0f}", flush=True)
        if rank == "1" and sys.argv[2] != "0" and not hogs and time.time() - start > 8:
            hogs = [subprocess.Popen([sys.executable, "-c",
                                      "import time\nend = time.time() + 12\n"
                                      "while time.time() < end: pass"])
                    for _ in range(int(sys.argv[2]))]
        time.sleep(0.05)
for h in hogs:
    h.wait()
print(f"rank {rank} done", flush=True)
"""


def _script(name: str, seconds: int, hogs: int) -> str:
    return f"""#!/bin/bash
#SBATCH --output={name}-%j.out -N2 --ntasks-per-node=1
#JOBWRAP --max-restarts=0
srun python3 pulse_rank.py {seconds} {hogs}
"""


def _pulse_events(cluster: Cluster, job_id: str) -> list[dict[str, object]]:
    return [e for e in cluster.events(job_id, root_only=True)
            if str(e["event"]).startswith("pulse.")]


def _joined(cluster: Cluster, job_id: str, node: str, timeout: float = 60) -> None:
    """The hub (on n1) heard ``node`` once: the pulse runs for this job."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        log = cluster.log_of("n1")
        text = log.read_text(errors="replace") if log.exists() else ""
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if (record.get("event"), record.get("joined_node"),
                        record.get("job_id")) == ("pulse.joined", node, job_id):
                    return
        time.sleep(0.2)
    raise AssertionError(f"{node} never joined {job_id}'s pulse: {text[-3000:]}")


def test_a_frozen_watcher_and_a_starved_node_keep_their_place(cluster: Cluster) -> None:
    cluster.write_user_file("pulse_rank.py", RANK)
    job_id = cluster.submit(_script("slow", 30, 8), "-w", "n1,n2", name="slow.sh")
    _joined(cluster, job_id, "n2")
    watcher = cluster.watcher_pid(job_id, "n2")
    assert watcher is not None
    proc = psutil.Process(watcher)
    proc.send_signal(signal.SIGSTOP)  # the watcher frozen 3 s (a stall, a debugger)
    time.sleep(3)
    proc.send_signal(signal.SIGCONT)
    info = cluster.wait_job(job_id, states=TERMINAL, timeout=120)
    out = (cluster.work / f"slow-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED", out
    assert "rank 0 done" in out and "rank 1 done" in out, out
    assert _pulse_events(cluster, job_id) == []  # nothing lost, nothing fenced
    assert not cluster.node_states().get("n2", "").startswith("down")


def test_a_node_cut_off_from_the_hub_fences_itself_and_nothing_writes_after(
        cluster: Cluster) -> None:
    """The hub's node stops answering for 20 s (its watcher frozen: to n2 that is the
    same silence as a cut cable). n2 hears no ack and kills the job's processes on
    itself; its rank's last write is before the fence. The hub, back, blames no node."""
    cluster.write_user_file("pulse_rank.py", RANK)
    job_id = cluster.submit(_script("fence", 90, 0), "-w", "n1,n2", name="fence.sh")
    _joined(cluster, job_id, "n2")
    hub = cluster.watcher_pid(job_id, "n1")
    assert hub is not None
    proc = psutil.Process(hub)
    proc.send_signal(signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 30
        fenced: list[dict[str, object]] = []
        while time.monotonic() < deadline and not fenced:
            fenced = [e for e in _pulse_events(cluster, job_id) if e["event"] == "pulse.fenced"]
            time.sleep(0.2)
        assert [e["node"] for e in fenced] == ["n2"], _pulse_events(cluster, job_id)
        assert int(str(fenced[0]["killed"])) >= 1 and "no ack" in str(fenced[0]["why"])
        time.sleep(20 - 5)  # the rest of the 20 s: nothing of the job runs on n2
        ticks = (cluster.work / f"ticks-{job_id}-1").read_text().split()
        assert float(ticks[-1]) < float(str(fenced[0]["ts"])), (ticks[-3:], fenced)
    finally:
        proc.send_signal(signal.SIGCONT)
    time.sleep(3)  # the hub, back, reads n2's goodbye; it must blame no one
    assert [e["event"] for e in _pulse_events(cluster, job_id)] == ["pulse.fenced"]
    assert not cluster.node_states().get("n2", "").startswith("down")
    Runner(cluster.env()).run(["scancel", job_id], timeout=20, check=False)  # rank 0 waits
    info = cluster.wait_job(job_id, states=TERMINAL, timeout=120)
    assert info["JobState"] != "COMPLETED"


LOSS = """#!/bin/bash
#SBATCH --output=loss-%j.out --open-mode=append -N2 --ntasks-per-node=1
#JOBWRAP --max-restarts=1
if [ "${SLURM_RESTART_COUNT:-0}" != 0 ]; then
  echo "attempt $SLURM_RESTART_COUNT on $SLURM_JOB_NODELIST"; exit 0
fi
srun bash -c 'for i in $(seq 120); do echo "rank $SLURM_PROCID $i"; sleep 1; done'
"""


def test_a_node_lost_whole_without_a_spare_requeues_the_job_away_from_it_in_seconds(
        cluster: Cluster) -> None:
    """No spare: n2 lost whole (slurmd, steps, ranks, watcher frozen) at Slurm's
    SlurmdTimeout=300. The pulse sets it DOWN in seconds; Slurm ends the attempt and the
    job runs again on other nodes, long before Slurm would have noticed by itself."""
    import os

    slurmd = next(d for d in cluster.daemons if d.name == "slurmd-n2")
    job_id = cluster.submit(LOSS, name="loss.sh")
    out = cluster.work / f"loss-{job_id}.out"
    _joined(cluster, job_id, "n2")
    frozen: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while "rank 1 3" not in (out.read_text() if out.exists() else ""):
            assert time.monotonic() < deadline, "the job never ran"
            time.sleep(0.2)
        watcher = cluster.watcher_pid(job_id, "n2")
        assert watcher is not None
        tasks = [p for p in psutil.process_iter(["environ"])
                 if (p.info["environ"] or {}).get("SLURM_JOB_ID") == job_id
                 and (p.info["environ"] or {}).get("SLURMD_NODENAME") == "n2"]
        steps = {q.pid: q for p in tasks for q in p.parents() if q.name() == "slurmstepd"}
        frozen = [psutil.Process(watcher), *steps.values(), *tasks]
        lost_at = time.time()
        os.kill(slurmd.pid, signal.SIGSTOP)
        for proc in frozen:
            proc.send_signal(signal.SIGSTOP)
        info = cluster.wait_job(job_id, states={"COMPLETED", "FAILED", "CANCELLED"},
                                timeout=150)
        output = out.read_text()
        assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, output)
        assert "attempt 1 on n[1,3]" in output or "attempt 1 on n1,n3" in output, output
        events = _pulse_events(cluster, job_id)
        lost = [e for e in events if e["event"] == "pulse.lost"]
        assert [e["lost"] for e in lost] == ["n2"], events
        assert float(str(lost[0]["ts"])) - lost_at < 10, "seconds, not SlurmdTimeout's 300"
        ends = [(e["attempt"], e["kind"]) for e in cluster.events(job_id)
                if e["event"] == "attempt.end" and e["source"] == "root"]
        assert ends[0] == (0, "node_failure"), ends
    finally:
        for proc in frozen:  # the node "reboots": its processes are gone
            with contextlib.suppress(psutil.Error):
                proc.kill()
        os.kill(slurmd.pid, signal.SIGKILL)
        cluster.daemons.remove(slurmd)
        cluster.start_daemon("slurmd-n2")
        Runner(cluster.env()).run(["scontrol", "update", "NodeName=n2", "State=RESUME"],
                                  timeout=20, check=False)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not cluster.node_states().get(
                "n2", "").startswith("idle"):
            time.sleep(1)
