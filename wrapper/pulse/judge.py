"""The job's ranks judged together: a hang called in seconds, and only a hang; a slow node
named (``SlowJudge``, at the end).

The first node's watcher gets every node's sample (wrapper/watch/ranks.py) each
``[pulse] sample_interval``, its own and, over the pulse, the other nodes'. A rank *moved*
between two samples when its CPU time (with its helpers') grew by more than
``CPU_QUIET`` of a CPU, its bytes read or written changed, its Python stack changed, or a
thread of it waits on storage (a slow disk is slow, not stuck).

The job is *stuck* in a round when some rank waits inside a collective and

- every rank that does not wait there has not moved (those are the stuck ones: the
  collective cannot complete without them), or
- every rank waits inside a collective (two at least) and none moved (a collective
  whose members never meet: the rank standing apart from the others' frame is named).

A hang is the job stuck in every round for ``window`` seconds: ``[pulse] hang_floor``
(15 s), or ``hang_k`` x the longest stretch the job was stuck and then went on by itself,
whichever is longer. A round where a node's sample is missing or late is blind: nothing
is concluded from part of the job, and the count starts again.

Not a hang, by these rules: a rank writing a checkpoint while the others wait at a barrier
(its bytes move), every rank waiting on its data loader (no rank inside a collective), a
first step that compiles (its CPU moves), one rank evaluating while the others wait (its
CPU moves), a one-process job (no collective). A rank stuck in a busy loop moves its CPU:
that hang is left to the supervisor's slower rule (wrapper/supervisor/monitor.py).
"""

from __future__ import annotations

import statistics
from collections import Counter, deque
from collections.abc import Collection, Mapping
from dataclasses import field
from typing import Any

from wrapper.fastdataclass import dataclass

CPU_QUIET = 0.03  # share of one CPU a waiting or stuck rank may still use (its threads)
LATE_AFTER = 2.5  # sample intervals after which a node's sample is late


@dataclass(frozen=True)
class Verdict:
    stuck: list[dict[str, Any]]  # the ranks named: node, pid, rank, at
    waiting: int  # ranks waiting inside a collective
    ranks: int  # ranks with a stack read
    held_s: float  # seconds the job was stuck
    window_s: float
    why: str


@dataclass
class _Rank:
    cpu: float
    io: int
    sig: str


@dataclass
class HangJudge:
    floor: float
    k: float
    interval: float
    seen: dict[tuple[str, Any], _Rank] = field(default_factory=dict)
    since: float | None = None  # when the job was first seen stuck in this stretch
    last: float | None = None  # the previous round's time
    longest: float = 0.0  # the longest stretch stuck that ended by itself
    fired: bool = False  # a verdict was given for this stretch

    @property
    def window(self) -> float:
        return max(self.floor, self.k * self.longest)

    def round(self, now: float, samples: Mapping[str, tuple[float, dict[str, Any]]],
              nodes: Collection[str]) -> Verdict | None:
        """One round: ``samples`` maps each node to (when its sample came, the sample);
        ``nodes``: the nodes whose samples the job needs (its nodes not lost)."""
        dt = now - self.last if self.last is not None else self.interval
        self.last = now
        late = [n for n in nodes if n not in samples
                or now - samples[n][0] > LATE_AFTER * self.interval]
        ranks = [(n, r) for n in nodes if n in samples
                 for r in samples[n][1].get("ranks", []) if isinstance(r, dict)]
        moved = {(n, r.get("pid")): self._moved(n, r, dt) for n, r in ranks}
        self.seen = {key: value for key, value in self.seen.items() if key in moved}
        if late:
            self._broken(now, stretch_ended=False)
            return None
        stuck, why = _stuck(ranks, moved)
        if stuck is None:
            self._broken(now, stretch_ended=True)
            return None
        if self.since is None:
            self.since = now - dt  # it was stuck since the round before, at the latest
        held = now - self.since
        if held < self.window - 0.05 or self.fired:  # rounds drift by milliseconds
            return None
        self.fired = True
        read = [r for _, r in ranks if "sig" in r]
        return Verdict(stuck=stuck, waiting=sum(1 for r in read if r.get("coll")),
                       ranks=len(read), held_s=round(held, 1),
                       window_s=round(self.window, 1), why=why)

    def _moved(self, node: str, rank: dict[str, Any], dt: float) -> bool:
        key = (node, rank.get("pid"))
        now = _Rank(cpu=float(rank.get("cpu") or 0.0), io=int(rank.get("io") or 0),
                    sig=str(rank.get("sig", "")))
        before = self.seen.get(key)
        self.seen[key] = now
        if before is None or rank.get("d"):
            return True
        return now.cpu - before.cpu > CPU_QUIET * max(dt, 0.1) or now.io != before.io or \
            (now.sig != before.sig and bool(now.sig))

    def _broken(self, now: float, *, stretch_ended: bool) -> None:
        if self.since is not None and stretch_ended and not self.fired:
            self.longest = max(self.longest, now - self.since)
        self.since, self.fired = None, False


def _stuck(ranks: list[tuple[str, dict[str, Any]]], moved: Mapping[tuple[str, Any], bool]
           ) -> tuple[list[dict[str, Any]] | None, str]:
    """The stuck ranks when the job is stuck in this round ([] when none can be named);
    None when it is not."""
    if any(moved[(n, r.get("pid"))] for n, r in ranks if "sig" not in r):
        return None, ""  # a rank whose stack could not be read is working
    read = [(n, r) for n, r in ranks if "sig" in r]
    waiting = [(n, r) for n, r in read if r.get("coll")]
    others = [(n, r) for n, r in read if not r.get("coll")]
    if not waiting:
        return None, ""
    if others:
        if any(moved[(n, r.get("pid"))] for n, r in others):
            return None, ""
        return [_named(n, r) for n, r in others], \
            f"{len(waiting)} of {len(read)} ranks wait inside a collective; " \
            f"{len(others)} neither joined it nor moved"
    if len(waiting) < 2 or any(moved[(n, r.get("pid"))] for n, r in waiting):
        return None, ""
    top, count = Counter(str(r.get("at")) for _, r in waiting).most_common(1)[0]
    if count * 2 > len(waiting) and count < len(waiting):
        return [_named(n, r) for n, r in waiting if r.get("at") != top], \
            f"every rank waits inside a collective and none moved; {count} of " \
            f"{len(waiting)} wait at {top}"
    return [], f"every rank ({len(waiting)}) waits inside a collective and none moved"


def _named(node: str, rank: dict[str, Any]) -> dict[str, Any]:
    return {"node": node, "pid": rank.get("pid"), "rank": str(rank.get("rank", "")),
            "at": str(rank.get("at", ""))}


def label(stuck: dict[str, Any]) -> str:
    who = f"rank {stuck['rank']}" if stuck.get("rank") else "a rank"
    return f"{who} (pid {stuck.get('pid')} on {stuck.get('node')}) at {stuck.get('at')}"



# -- slow nodes --------------------------------------------------------------------------------
MIN_TYPICAL = 0.05  # a typical rank needing less of a CPU is idle: its job is not judged


@dataclass
class SlowJudge:
    """Slow nodes named from the same samples, with no change to the script.

    A rank's *demand* is the share of the last ``window`` seconds its main thread spent on
    a CPU or waiting for one (``busy``: /proc/PID/schedstat's run time plus run delay, to
    which a CPU quota's throttling and a noisy neighbour both add). In a job whose ranks
    meet at every step (DDP), the slow rank works all the time and the others wait for it,
    idle: its demand is the highest. A rank's *score* is the median rank's demand over its
    own, at most 1.0 (1.0 = as fast as the job's typical rank; 0.7 = it needs 1/0.7 of
    their time; with an even count of ranks the lower median); a node's, the lowest of its
    ranks'. A node scored under ``below`` in every
    round for ``hold`` seconds is named, once per attempt. Nothing is judged while the
    hang judge holds the job stuck, in a job on one node, whose typical rank is idle (a
    job waiting on its data), or while a node scored before has no rank scored (the job
    ending: every node's last score is kept as it was).
    """

    window: float = 60.0
    below: float = 0.85
    hold: float = 30.0
    interval: float = 3.0  # the samples' interval: a node's sample older than
    # LATE_AFTER of them is stale, and adds nothing
    history: dict[tuple[str, Any], deque[tuple[float, float]]] = field(default_factory=dict)
    low_since: dict[str, float] = field(default_factory=dict)
    named: dict[str, float] = field(default_factory=dict)  # node: its score when named
    scores: dict[str, float] = field(default_factory=dict)  # the newest, per node

    def round(self, now: float, samples: Mapping[str, tuple[float, dict[str, Any]]],
              nodes: Collection[str], *, stuck: bool = False) -> list[str]:
        """The nodes named in this round (``stuck``: the hang judge holds the job stuck;
        a hang says nothing of speed). Each rank's points are its node's own clock (the
        sample's ``t``): a sample seen twice adds one point, and a node's stale sample
        none (its ranks' demand is then not judged, nor the job's)."""
        seen: set[tuple[str, Any]] = set()
        fresh: set[str] = set()
        for node in nodes:
            heard, sample = samples.get(node, (0.0, {}))
            if node not in samples or now - heard > LATE_AFTER * self.interval:
                seen.update(k for k in self.history if k[0] == node)  # kept, not added to
                continue
            fresh.add(node)
            t = sample.get("t")
            t = float(t) if isinstance(t, int | float) and not isinstance(t, bool) else heard
            listed = sample.get("ranks")
            for rank in listed if isinstance(listed, list) else []:
                busy = rank.get("busy") if isinstance(rank, dict) else None
                if not isinstance(busy, int | float) or isinstance(busy, bool):
                    continue
                key = (node, rank.get("pid"))
                seen.add(key)
                points = self.history.setdefault(key, deque())
                if points and t <= points[-1][0]:
                    continue  # the same sample again (or a clock that went back)
                points.append((t, float(busy)))
                while points[-1][0] - points[0][0] > self.window:
                    points.popleft()
        self.history = {k: v for k, v in self.history.items() if k in seen}
        span = self.window - 1.5 * self.interval  # what a full window holds, at least
        demand = {k: (p[-1][1] - p[0][1]) / (p[-1][0] - p[0][0])
                  for k, p in self.history.items()
                  if k[0] in fresh and len(p) >= 2 and p[-1][0] - p[0][0] >= max(span, 1e-6)}
        scored = {n for n, _ in demand}
        # a node scored before whose ranks are gone (the job ending, a rank restarting)
        # leaves the others unjudged, its score kept; a node lost leaves the judge
        self.scores = {n: v for n, v in self.scores.items() if n in nodes}
        if stuck or len(scored) < 2 or not set(self.scores) <= scored:
            self.low_since.clear()
            return []
        # the lower middle: with an even count the typical rank is a real one, the faster
        # of the two; so in a 2-rank job one rank evaluating while the other waits idle is
        # a typical rank idle (not judged), not a node half as fast
        typical = statistics.median_low(demand.values())
        if typical < MIN_TYPICAL:
            self.low_since.clear()
            return []
        scores: dict[str, float] = {}
        for (node, _), d in demand.items():
            score = min(1.0, typical / d) if d > 0 else 1.0
            scores[node] = round(min(score, scores.get(node, 1.0)), 2)
        self.scores = dict(sorted(scores.items()))
        newly = []
        for node, score in self.scores.items():
            if score >= self.below:
                self.low_since.pop(node, None)
                continue
            since = self.low_since.setdefault(node, now)
            if now - since >= self.hold and node not in self.named:
                self.named[node] = score
                newly.append(node)
        return newly
