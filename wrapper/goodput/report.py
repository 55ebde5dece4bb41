"""The cluster view of ``jobwrap report``: goodput over the archived jobs.

``build`` is pure (ledgers in, a ``Report`` out): failures by class and by node, each
node's flaky score, the MTBF, the restart gaps, the distribution of ETTR over ended
jobs. ``from_archive`` reads the ledgers from the archive's manifests.

Slow nodes: each node's count of attempts in which the pulse named it slow (root's
``pulse.speed``, wrapper/pulse/judge.py), its lowest speed score then, and how many
users' jobs named it. The score comes from the job's own processes, which their user
shapes (a rank that spins is slow to the judge): a node named by many users' jobs is one
for the site to look at; one user's jobs alone can name any node they run on.

Flaky-node score: how much more often a node's attempts end in a failure root has
confirmed the node caused (``NODE_CAUSES``: a GPU fault root's own probe or watcher
found, a node failure from Slurm's record) than the cluster's attempts do. Classes the
job's own output or exit can pick (a hang, a collective timeout, a kill, the user's
errors) never count against a node: a user could otherwise blame any node they pin jobs
to. The score is smoothed by one pseudo-attempt at the cluster's rate so that one
failure on a node that ran two attempts is no verdict:
``score = ((failures + 1) / (attempts + 1 / rate)) / rate``. About 1 is ordinary; a node
is listed as flaky at ``FLAKY_SCORE`` or more with at least two such failures.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, field
from typing import TYPE_CHECKING, Any

from wrapper.archive.ledger import NOT_A_FAILURE, RUNNING_CLASS, Ledger
from wrapper.fastdataclass import dataclass

if TYPE_CHECKING:
    from wrapper.archive.index import Index

# The only classes that count against a node: both come from root's facts alone
# (root's GPU probe or node watcher; Slurm's NODE_FAIL), never from the job's output.
NODE_CAUSES = frozenset({"hardware", "node_failure"})
FLAKY_SCORE = 2.0
ETTR_BUCKETS = (0.5, 0.8, 0.9, 0.95, 0.99, 1.0)


@dataclass(frozen=True)
class JobLedger:
    job_id: str
    user: str
    ledger: Ledger


@dataclass
class NodeStats:
    attempts: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    node_failures: int = 0
    score: float = 0.0
    slow: int = 0  # attempts in which the pulse named it slow
    slowest: float | None = None  # its lowest speed score when named (1.0: as fast)
    slow_users: int = 0  # the users whose jobs named it (one user's jobs can say anything)


@dataclass
class Report:
    since: float | None
    jobs: int = 0
    attempts: int = 0
    failures: int = 0
    failures_by_class: dict[str, int] = field(default_factory=dict)
    nodes: dict[str, NodeStats] = field(default_factory=dict)
    flaky_nodes: list[str] = field(default_factory=list)
    run_s: float = 0.0
    mtbf_s: float | None = None
    wall_s: float = 0.0
    productive_s: float = 0.0
    lost_s: float = 0.0
    lost_by_class: dict[str, float] = field(default_factory=dict)
    restart_gaps: int = 0
    mean_restart_gap_s: float | None = None
    mean_restart_gap_by_class: dict[str, float] = field(default_factory=dict)
    ettr: float | None = None  # productive / wall over all jobs
    ettr_of_ended_jobs: dict[str, float] = field(default_factory=dict)  # min, p50, mean ...
    ettr_histogram: dict[str, int] = field(default_factory=dict)  # "<=0.9": jobs
    worst_jobs: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def build(jobs: Iterable[JobLedger], *, since: float | None = None) -> Report:
    report = Report(since=since)
    gaps: dict[str, list[float]] = {}
    ended: list[float] = []  # the ETTR of each ended job
    worst: list[tuple[float, str, str, int, float]] = []  # the lowest five, kept as we go
    slow_users: dict[str, set[str]] = {}  # node: the users whose jobs named it slow
    for job in jobs:
        ledger = job.ledger
        if not ledger.attempts:
            continue
        report.jobs += 1
        report.wall_s += ledger.wall_s
        report.productive_s += ledger.productive_s
        report.lost_s += ledger.lost_s
        for kind, lost in ledger.lost_by_class.items():
            report.lost_by_class[kind] = report.lost_by_class.get(kind, 0.0) + lost
        for kind, seen in ledger.gaps_by_class.items():
            gaps.setdefault(kind, []).extend(seen)
        for attempt in ledger.attempts:
            report.run_s += attempt.ended_at - attempt.started_at
            if attempt.in_place:  # jobwrap run's word: the counts are root's verdicts
                continue
            report.attempts += 1
            failed = attempt.kind not in NOT_A_FAILURE
            if failed:
                report.failures += 1
                report.failures_by_class[attempt.kind] = \
                    report.failures_by_class.get(attempt.kind, 0) + 1
            for node in attempt.nodes:
                stats = report.nodes.get(node)
                if stats is None:  # not setdefault: a NodeStats made per attempt was a
                    stats = report.nodes[node] = NodeStats()  # fifth of report's time
                stats.attempts += 1
                if failed:
                    stats.failures[attempt.kind] = stats.failures.get(attempt.kind, 0) + 1
                if attempt.kind in NODE_CAUSES:
                    stats.node_failures += 1
            for node, speed in attempt.slow.items():
                stats = report.nodes.get(node)
                if stats is not None:  # one of its nodes, counted above
                    stats.slow += 1
                    stats.slowest = speed if stats.slowest is None else min(stats.slowest,
                                                                            speed)
                    slow_users.setdefault(node, set()).add(job.user)
        if ledger.attempts[-1].kind != RUNNING_CLASS:
            ended.append(ledger.ettr)
            if ledger.ettr < 1.0:
                bisect.insort(worst, (ledger.ettr, job.user, job.job_id, ledger.failures,
                                      ledger.lost_s))
                del worst[5:]
    for node, users in slow_users.items():
        report.nodes[node].slow_users = len(users)
    report.mtbf_s = report.run_s / report.failures if report.failures else None
    all_gaps = [g for seen in gaps.values() for g in seen]
    report.restart_gaps = len(all_gaps)
    report.mean_restart_gap_s = sum(all_gaps) / len(all_gaps) if all_gaps else None
    report.mean_restart_gap_by_class = {k: sum(v) / len(v) for k, v in sorted(gaps.items())
                                        if v}
    report.ettr = report.productive_s / report.wall_s if report.wall_s > 0 else None
    _score_nodes(report)
    values = sorted(ended)
    if values:
        report.ettr_of_ended_jobs = {"jobs": float(len(values)), "min": values[0],
                                     "p10": _quantile(values, 0.1),
                                     "p50": _quantile(values, 0.5),
                                     "p90": _quantile(values, 0.9), "max": values[-1],
                                     "mean": sum(values) / len(values)}
        for bound in ETTR_BUCKETS:
            report.ettr_histogram[f"<={bound:g}"] = sum(1 for v in values if v <= bound)
    report.worst_jobs = [{"job_id": job_id, "user": user, "ettr": ettr, "failures": failures,
                          "lost_s": lost} for ettr, user, job_id, failures, lost in worst]
    return report


def _score_nodes(report: Report) -> None:
    attempts = sum(s.attempts for s in report.nodes.values())
    failures = sum(s.node_failures for s in report.nodes.values())
    if not attempts:
        return
    rate = max(failures, 1) / attempts  # no failure at all: every score stays below 1
    for name, stats in report.nodes.items():
        stats.score = ((stats.node_failures + 1) / (stats.attempts + 1 / rate)) / rate
        if stats.score >= FLAKY_SCORE and stats.node_failures >= 2:
            report.flaky_nodes.append(name)
    report.flaky_nodes.sort(key=lambda n: -report.nodes[n].score)


def _quantile(values: Sequence[float], q: float) -> float:
    index = q * (len(values) - 1)
    low = int(index)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (index - low)


def from_archive(root: str, *, since: float | None, now: float,
                 user: str | None = None) -> tuple[list[JobLedger], list[str]]:
    """Every archived job's ledger (updated since ``since``) read from the manifests the
    caller may read (each parsed once; folders older than ``since`` not opened), and what
    could not be read. Without the index: an ordinary user's own folder."""
    from wrapper.archive import store
    from wrapper.archive.ledger import account, from_summaries

    out: list[JobLedger] = []
    problems: list[str] = []
    for info, manifest in store.scan(root, user, since, sized=False):
        attempts = (manifest or {}).get("attempts")
        if not isinstance(attempts, list):
            problems.append(f"job {info.job_id} of {info.user}: " + (
                "its manifest lists no attempts" if manifest is not None
                else "its manifest does not parse"))
            continue
        summaries = [a for a in attempts if isinstance(a, dict)]
        out.append(JobLedger(info.job_id, info.user, account(from_summaries(summaries),
                                                             now=now)))
    return out, problems


def from_index(index: Index, *, since: float | None,
               user: str | None = None) -> tuple[Iterator[JobLedger], list[str]]:
    """The same from the archive's index, streamed: no manifest opened (each job's ledger
    was computed when it was indexed, as of its manifest's ``updated_at``, and kept brief:
    ``ledger.ledger_brief``). The problems fill in as the ledgers are read."""
    from wrapper.archive.ledger import ledger_from_brief

    problems: list[str] = []

    def ledgers() -> Iterator[JobLedger]:
        for job_id, name, ledger in index.ledgers(since=since, user=user):
            if ledger is None:
                problems.append(f"job {job_id} of {name}: its manifest does not parse or "
                                "lists no attempts")
                continue
            yield JobLedger(job_id, name, ledger_from_brief(ledger))

    return ledgers(), problems


def render(report: Report) -> str:
    from wrapper.goodput.view import span

    if not report.jobs:
        return "no archived jobs in this period\n"
    ettr = "?" if report.ettr is None else f"{report.ettr:.1%}"
    lines = [f"{report.jobs} jobs, {report.attempts} attempts, {report.failures} failures; "
             f"goodput (ETTR) {ettr} of {span(report.wall_s)}; lost {span(report.lost_s)}",
             "MTBF " + ("n/a (no failure)" if report.mtbf_s is None else span(report.mtbf_s))
             + "; mean restart gap " + ("n/a" if report.mean_restart_gap_s is None
                                        else span(report.mean_restart_gap_s))
             + f" over {report.restart_gaps} restarts"]
    if report.failures_by_class:
        lines.append("failures by class:")
        for kind, count in sorted(report.failures_by_class.items(), key=lambda p: -p[1]):
            gap = report.mean_restart_gap_by_class.get(kind)
            lines.append(f"  {kind:<14} {count:>5}  lost {span(report.lost_by_class.get(kind, 0))}"
                         + (f"  mean restart gap {span(gap)}" if gap is not None else ""))
    if report.nodes:
        lines.append("nodes (flaky score: 1 is the cluster's rate):")
        for name, stats in sorted(report.nodes.items(), key=lambda p: -p[1].score):
            said = ", ".join(f"{k} {v}" for k, v in sorted(stats.failures.items())) or "-"
            flag = "  FLAKY" if name in report.flaky_nodes else ""
            slow = f"  named slow in {stats.slow} ({stats.slow_users} user" \
                f"{'s' if stats.slow_users != 1 else ''}; speed down to " \
                f"{stats.slowest:.2f})" if stats.slow and stats.slowest is not None else ""
            lines.append(f"  {name:<14} attempts {stats.attempts:>4}  score "
                         f"{stats.score:5.2f}  failures: {said}{flag}{slow}")
    dist = report.ettr_of_ended_jobs
    if dist:
        lines.append(f"ETTR of {int(dist['jobs'])} ended jobs: min {dist['min']:.2f}  p10 "
                     f"{dist['p10']:.2f}  median {dist['p50']:.2f}  p90 {dist['p90']:.2f}  "
                     f"mean {dist['mean']:.2f}")
        lines.append("  " + "  ".join(f"{k}: {v}" for k, v in report.ettr_histogram.items()))
    for job in report.worst_jobs:
        lines.append(f"  low: job {job['job_id']} ({job['user']}) ETTR {job['ettr']:.2f}, "
                     f"{job['failures']} failures, lost {span(job['lost_s'])}")
    return "\n".join(lines) + "\n"
