"""The site's choice for a node the pulse names slow (docs/recovery.md, Slow nodes).

By default the record is all: each job's output, ``jobwrap status`` and ``jobwrap report``
(per node, with the number of users whose jobs named it). A site that sets ``[pulse]
slow_drain_users = N`` has the indexer (``jobwrap archive index``, root, the timer on the
index's host) drain a node once jobs of N different users named it slow within ``[pulse]
slow_drain_days``, with the reason ``jobwrap: slow: ...``.

Why users and not jobs: the score is the user's process state (a rank of one's own that
spins makes its node look slow), so one user's jobs, however many, never drain a node;
N different users' jobs each seeing the node slow is the evidence. Why only an admin
resumes it: a slow node passes every health check, so ``jobwrap check all --resume``
(the health check) leaves a ``jobwrap: slow:`` drain alone (wrapper/gpu/undrain.py). A
node already drained, down or in maintenance is never touched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from wrapper.fastdataclass import dataclass
from wrapper.slurm.commands import SLOW_DRAIN_PREFIX

if TYPE_CHECKING:
    from wrapper.archive.index_base import Index
    from wrapper.config import Config
    from wrapper.slurm import SlurmBackend

DAY_S = 86400.0


@dataclass(frozen=True)
class NamedSlow:
    node: str
    users: frozenset[str]
    attempts: int
    lowest: float


def named(index: Index, since: float) -> dict[str, NamedSlow]:
    """Every node the pulse named slow in jobs indexed since ``since``: by whose jobs, in
    how many attempts, and its lowest score."""
    from wrapper.archive.ledger import ledger_from_brief

    users: dict[str, set[str]] = {}
    attempts: dict[str, int] = {}
    lowest: dict[str, float] = {}
    for _, user, brief in index.ledgers(since=since, user=None):
        if brief is None:
            continue
        for attempt in ledger_from_brief(brief).attempts:
            for node, score in attempt.slow.items():
                users.setdefault(node, set()).add(user)
                attempts[node] = attempts.get(node, 0) + 1
                lowest[node] = min(lowest.get(node, score), score)
    return {node: NamedSlow(node, frozenset(who), attempts[node], lowest[node])
            for node, who in users.items()}


def reason(found: NamedSlow, days: float) -> str:
    return (f"{SLOW_DRAIN_PREFIX} named by {len(found.users)} users' jobs in {days:g} d "
            f"({found.attempts} attempts, speed down to {found.lowest:.2f}); resume by hand "
            "once fixed")[:200]


def drain_named(cfg: Config, index: Index, backend: SlurmBackend, now: float,
                say: Callable[[str], None]) -> list[str]:
    """Drain each node named slow by ``[pulse] slow_drain_users`` users' jobs within
    ``slow_drain_days`` (none when it is 0); returns the nodes drained."""
    from wrapper import log
    from wrapper.errors import SlurmError

    wanted = cfg.pulse.slow_drain_users
    if wanted <= 0:
        return []
    drained = []
    for node, found in sorted(named(index, now - cfg.pulse.slow_drain_days * DAY_S).items()):
        if len(found.users) < wanted:
            continue
        try:
            state = backend.node_info(node).get("State", "")
            flags = {f for f in state.upper().replace("+", " ").split() if f}
            if flags & {"DRAIN", "DRAINED", "DRAINING", "DOWN", "MAINT", "REBOOT_REQUESTED",
                        "FAIL"}:
                continue  # already out of service, whoever put it there: left as it is
            why = reason(found, cfg.pulse.slow_drain_days)
            backend.drain_node(node, why)
        except SlurmError as exc:
            say(f"node {node}: named slow by {len(found.users)} users' jobs, but Slurm "
                f"could not drain it: {exc}")
            continue
        log.get().warning("pulse.slow_drained", node=node, users=len(found.users),
                          attempts=found.attempts, lowest=found.lowest, reason=why)
        say(f"drained {node}: {why}")
        drained.append(node)
    return drained
