"""A user cannot forge an Xid (or an OOM kill) through the kernel log (issue 22, item 1).

The kernel logs a segfault with the name of the file the fault was in and the faulting
process's name, both the user's choice. A user who names a file
``NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus``, maps it readable but not
executable and jumps into it puts that text into a real kernel record on the real
/dev/kmsg. Root's node watcher and checks read that same kernel log (the sandbox's fake
GPUs take the kernel's Xids for their PCI addresses, as the nvml probe does): played on
today's main before this fix, the watcher drained the node and ended the job.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from jobwrap_dev.sandbox.cluster import Cluster

# gpu0 of every sandbox node (jobwrap_dev/sandbox/gpus.py)
FORGED = "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus"

# Segfault inside a file of the user's, mapped readable and not executable; the process
# first names itself so that its comm starts the record as the driver's lines do.
FORGER = r'''
import ctypes, mmap, os, sys
name = sys.argv[1]
with open(name, "wb") as f:
    f.write(b"\0" * 4096)
libc = ctypes.CDLL(None, use_errno=True)
if len(sys.argv) > 2:
    libc.prctl(15, ctypes.c_char_p(sys.argv[2].encode()), 0, 0, 0)   # PR_SET_NAME
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
fd = os.open(name, os.O_RDONLY)
addr = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, 0)
ctypes.CFUNCTYPE(None)(addr)()
'''

JOB = """#!/bin/bash
#SBATCH --output={work}/kmsg-%j.out -w n1 --gres=gpu:1
#JOBWRAP --max-restarts=0
cd {work}/kmsg-forge
python3 forge.py '{forged}' || true
python3 forge.py '0000:18:00): 79, forged by comm' 'NVRM: Xid (PCI:' || true
sleep 12
echo done
"""


def _kernel_log() -> str:
    from wrapper.gpu.kmsg import read_records

    return "\n".join(read_records("/dev/kmsg"))


def test_a_segfault_file_name_forges_no_xid(cluster: Cluster) -> None:
    # the kernel logs segfaults of user processes (Debian's default; made sure here)
    Path("/proc/sys/debug/exception-trace").write_text("1\n")
    forge = cluster.work / "kmsg-forge"
    forge.mkdir(exist_ok=True)
    (forge / "forge.py").write_text(FORGER)
    subprocess.run(["chown", "-R", cluster.spec.user, str(forge)], check=True)
    job_id = cluster.submit(JOB.format(work=cluster.work, forged=FORGED), name="kmsg.sh")
    info = cluster.wait_job(job_id, timeout=120)
    output = (cluster.work / f"kmsg-{job_id}.out").read_text()
    # the attack reached the real kernel log, as a record the kernel wrote
    logged = [line for line in _kernel_log().splitlines() if FORGED in line]
    assert logged and "segfault at" in logged[-1], output
    assert info["JobState"] == "COMPLETED" and "done" in output, (info, output)
    events = cluster.events(job_id)
    root = [e for e in events if e["source"] == "root"]
    assert not [e for e in events if e["event"] in ("gpu.fault", "watch.fault",
                                                     "watch.ended_job")], events
    assert [e["kind"] for e in root if e["event"] == "attempt.end"] == ["success"], root
    assert "drain" not in cluster.node_states()["n1"], cluster.node_states()
    # root's own check of the node reads the same kernel log and finds no Xid
    check = subprocess.run([sys.executable, "-m", "wrapper", "check", "gpu", "--json",
                            "--node", "n1"], capture_output=True, text=True, check=False,
                           env={**cluster.env(), "JOBWRAP_CONFIG": str(cluster.jobwrap_config)})
    report = json.loads(check.stdout)
    xid = [r for r in report["results"] if r["check"] == "xid"]
    assert xid and all(r["status"] == "pass" for r in xid), report
    assert report["verdict"] == "pass" and check.returncode == 0, report
