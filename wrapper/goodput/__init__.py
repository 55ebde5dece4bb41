"""Goodput: how much of a job's wall time produced kept progress (per job, per cluster).

One job's ledger (productive, lost, restart gaps, ETTR) is computed from its attempts by
``wrapper.archive.ledger``, whose index keeps it per job: goodput sits above the archive.
``report`` aggregates archived jobs into the cluster view of ``jobwrap report``;
``advice`` is the Young/Daly checkpoint interval; ``view`` the goodput block of
``jobwrap status``; ``hook`` the epilog's metrics, notifications and AdminComment.
"""
