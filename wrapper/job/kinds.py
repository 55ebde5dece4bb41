"""The classes an attempt can end in (``attempt.end``'s ``kind``), and which a retry can
help: the vocabulary root's judge (wrapper/restart/classify.py) gives and every reader of
an attempt's story (the status, the ledger, the archive) reads.
"""

from __future__ import annotations

# Classes, and whether a retry can help at all (the policy decides whether it will).
SUCCESS = "success"
HARDWARE = "hardware"
NODE_FAILURE = "node_failure"
HANG = "hang"
COLLECTIVE_TIMEOUT = "collective_timeout"  # gloo or NCCL: a peer vanished or timed out
NCCL_TIMEOUT = COLLECTIVE_TIMEOUT  # its name before gloo was recognised too
KILLED = "killed"  # SIGKILL from outside the job with no OOM kill recorded: retried
CUDA_OOM = "cuda_oom"
HOST_OOM = "host_oom"
WALLTIME = "walltime"
PREEMPTED = "preempted"
CANCELLED = "cancelled"
STAGING = "staging"  # the job's declared data could not be staged: the user's input
UNCHECKED = "unchecked"  # jobwrap's prolog did not run on the node for the attempt
USER_ERROR = "user_error"

RETRYABLE = {HARDWARE, NODE_FAILURE, HANG, COLLECTIVE_TIMEOUT, WALLTIME, PREEMPTED, HOST_OOM,
             USER_ERROR, KILLED, UNCHECKED}
# Classes that are no fault of the job: they do not count against its progress. Each
# rests on root's facts alone (root's GPU check, Slurm's NODE_FAIL and PREEMPTED); a kill
# is not among them, since the job can kill itself (``kill -9 $$``, ``exit 137``) and the
# brakes would then never apply: classes the job's own output or exit can pick may only
# make an attempt more the job's fault, never less.
NOT_THE_JOBS_FAULT = {HARDWARE, NODE_FAILURE, PREEMPTED, UNCHECKED}
