"""The root-side fault feed: one watcher per job and allocated node, started by the prolog.

The supervisor runs on the job's first node with the user's rights: it can read neither
the kernel log (Xids need root) nor the other nodes' GPUs. So the prolog of *every*
allocated node also starts a small root watcher (``python -I -m wrapper.watch``,
detached like the supervisor) that reads the health of that node's allocated GPUs through
the probe seam (NVML with Xids from the kernel log in production, the fake inventory in
the sandbox) every ``[supervisor] gpu_interval``. On a fault it records a root event
(``watch.fault``), drains the node with the precise reason (so the job's first node learns
of it from Slurm, which every node can ask) and ends the job; the epilog of that node
drains it again after its own post-job check, and the first node's decision classes the
attempt ``hardware`` and excludes the faulty node (``wrapper.restart.remote``).

It ends by itself: when the epilog of its node stops it, when Slurm says the attempt no
longer runs, or when Slurm stays unreachable for ``slurm_unreachable``. Nothing of the
job's user is read: only root's GPU readings, Slurm's answers and root's own record.
"""
