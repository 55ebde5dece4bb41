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

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from wrapper.fastdataclass import dataclass
from wrapper.slurm.commands import SLOW_DRAIN_PREFIX

if TYPE_CHECKING:
    from wrapper.archive.index_base import Index
    from wrapper.config import Config
    from wrapper.slurm import SlurmBackend

DAY_S = 86400.0
DRAINED = "slow-drained.json"  # in the archive's .index: the nodes drained, and when


@dataclass(frozen=True)
class NamedSlow:
    node: str
    users: frozenset[str]
    attempts: int
    lowest: float


def named(index: Index, since: float, after: dict[str, float] | None = None
          ) -> dict[str, NamedSlow]:
    """Every node the pulse named slow in jobs indexed since ``since``: by whose jobs, in
    how many attempts, and its lowest score. ``after``: per node, a time before which its
    attempts no longer count (its last drain for slowness: an admin resumed it since)."""
    from wrapper.archive.ledger import ledger_from_brief

    after = after or {}
    users: dict[str, set[str]] = {}
    attempts: dict[str, int] = {}
    lowest: dict[str, float] = {}
    for _, user, brief in index.ledgers(since=since, user=None):
        if brief is None:
            continue
        for attempt in ledger_from_brief(brief).attempts:
            for node, score in attempt.slow.items():
                if attempt.started_at <= after.get(node, float("-inf")):
                    continue
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
    ``slow_drain_days`` (none when it is 0); returns the nodes drained. A node's attempts
    before its last such drain no longer count: once an admin resumes it, new evidence
    is needed (the indexer's record, ``.index/slow-drained.json``)."""
    from wrapper import log
    from wrapper.errors import SlurmError
    from wrapper.gpu.undrain import OUT_OF_SERVICE

    wanted = cfg.pulse.slow_drain_users
    if wanted <= 0:
        return []
    root = cfg.paths.archive_root
    record = _drained(root)
    since = now - cfg.pulse.slow_drain_days * DAY_S
    drained = []
    for node, found in sorted(named(index, since, record).items()):
        if len(found.users) < wanted:
            continue
        try:
            state = backend.node_info(node).get("State", "")
            flags = {f for f in state.upper().replace("+", " ").split() if f}
            if flags & OUT_OF_SERVICE:
                continue  # already out of service, whoever put it there: left as it is
            why = reason(found, cfg.pulse.slow_drain_days)
            backend.drain_node(node, why)
        except SlurmError as exc:
            say(f"node {node}: named slow by {len(found.users)} users' jobs, but Slurm "
                f"could not drain it: {exc}")
            continue
        record[node] = now
        log.get().warning("pulse.slow_drained", node=node, users=len(found.users),
                          attempts=found.attempts, lowest=found.lowest, reason=why)
        say(f"drained {node}: {why}")
        drained.append(node)
    if drained:
        _keep_drained(root, {n: t for n, t in record.items() if t >= since})
    return drained


def _drained(root: str) -> dict[str, float]:
    """When the indexer last drained each node for slowness (within the window)."""
    from wrapper.archive._fs import open_dir, open_root, read_json
    from wrapper.archive.spool import FOLDER

    try:
        root_fd = open_root(root, create=False)
        try:
            index_fd = open_dir(root_fd, FOLDER)
            try:
                data = read_json(index_fd, DRAINED, max_bytes=1 << 20) or {}
            finally:
                os.close(index_fd)
        finally:
            os.close(root_fd)
    except OSError:
        return {}
    nodes = data.get("nodes")
    return {str(n): float(t) for n, t in nodes.items() if isinstance(t, int | float)} \
        if isinstance(nodes, dict) else {}


def _keep_drained(root: str, record: dict[str, float]) -> None:
    from wrapper.archive._fs import make_dir, open_root, write_json_atomic
    from wrapper.archive.spool import FOLDER, PASSABLE

    root_fd = open_root(root, create=False)
    try:
        index_fd = make_dir(root_fd, FOLDER, PASSABLE)
        try:
            write_json_atomic(index_fd, DRAINED, {"nodes": record}, PASSABLE)
        finally:
            os.close(index_fd)
    finally:
        os.close(root_fd)
