"""Goodput: how much of a job's wall time produced kept progress (per job, per cluster).

``accounting`` computes one job's ledger (productive, lost, restart gaps, ETTR) from its
attempts; ``report`` aggregates archived jobs into the cluster view of ``jobwrap report``;
``advice`` is the Young/Daly checkpoint interval.
"""
