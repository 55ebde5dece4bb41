"""An in-process Slurm for unit tests: the SlurmBackend protocol over plain dicts.

It answers what the hooks ask (a job's record and batch script, a node's record) from
what the test put in, and records what they did (drains, requeues, signals, AdminComments)
in ``calls``, so a test can drive a hook body without a cluster and check its decision.
A job it does not know raises SlurmError, as Slurm's commands would.
"""

from __future__ import annotations

from dataclasses import field

from wrapper.errors import SlurmError
from wrapper.fastdataclass import dataclass


@dataclass
class FakeSlurm:
    name = "fake"
    jobs: dict[str, dict[str, str]] = field(default_factory=dict)
    scripts: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)
    # job id -> (state, end) of each attempt, as sacct would print; absent: no accounting
    accounting: dict[str, list[tuple[str, float | None]]] = field(default_factory=dict)
    refuse_requeue: str = ""  # non-empty: requeue raises SlurmError with this text
    calls: list[tuple[str, ...]] = field(default_factory=list)
    timeouts: list[float | None] = field(default_factory=list)  # ended_attempts' timeouts

    def version(self) -> str:
        return "fake 0.0"

    def batch_script(self, job_id: str) -> str:
        self.calls.append(("batch_script", job_id))
        if job_id not in self.scripts:
            raise SlurmError(f"job {job_id}: no batch script")
        return self.scripts[job_id]

    def job_info(self, job_id: str) -> dict[str, str]:
        self.calls.append(("job_info", job_id))
        if job_id not in self.jobs:
            raise SlurmError(f"job {job_id}: Invalid job id specified")
        return dict(self.jobs[job_id])

    def node_info(self, node: str) -> dict[str, str]:
        if node not in self.nodes:
            raise SlurmError(f"node {node} not found")
        return dict(self.nodes[node])

    def nodes_info(self, nodes: list[str]) -> dict[str, dict[str, str]]:
        self.calls.append(("nodes_info", *nodes))
        return {n: {"NodeName": n, **self.nodes[n]} for n in nodes if n in self.nodes}

    def drain_node(self, node: str, reason: str) -> str:
        self.calls.append(("drain_node", node, reason))
        self.nodes.setdefault(node, {})["State"] = "DRAIN"
        return reason

    def resume_node(self, node: str) -> None:
        self.calls.append(("resume_node", node))

    def down_node(self, node: str, reason: str) -> str:
        self.calls.append(("down_node", node, reason))
        self.nodes.setdefault(node, {})["State"] = "DOWN"
        return reason

    def requeue(self, job_id: str, *, hold: bool = False, eligible_now: bool = False) -> None:
        self.calls.append(("requeue", job_id))
        if self.refuse_requeue:
            raise SlurmError(self.refuse_requeue)

    def shrink_job(self, job_id: str, keep: list[str]) -> None:
        self.calls.append(("shrink_job", job_id, *keep))
        if job_id in self.jobs:
            self.jobs[job_id]["NodeList"] = ",".join(keep)

    def exclude_nodes(self, job_id: str, nodes: list[str]) -> list[str]:
        self.calls.append(("exclude_nodes", job_id, *nodes))
        return list(nodes)

    def job_state(self, job_id: str) -> str:
        return self.jobs.get(job_id, {}).get("JobState", "")

    def job_state_and_limit(self, job_id: str) -> tuple[str, str]:
        job = self.jobs.get(job_id, {})
        return job.get("JobState", ""), job.get("TimeLimit", "")

    def ended_attempts(self, job_id: str, *, timeout: float | None = None
                       ) -> list[tuple[str, float | None]]:
        self.calls.append(("ended_attempts", job_id))
        self.timeouts.append(timeout)
        if job_id not in self.accounting:
            raise SlurmError("sacct: Slurm accounting storage is disabled")
        return list(self.accounting[job_id])

    def job_steps(self, job_id: str) -> list[str]:
        return []

    def signal_job(self, job_id: str, signal: str, *, full: bool = False) -> None:
        self.calls.append(("signal_job", job_id, signal))

    def kill_steps(self, job_id: str) -> list[str]:
        self.calls.append(("kill_steps", job_id))
        return []

    def cancel_step(self, job_id: str, step: str) -> None:
        self.calls.append(("cancel_step", job_id, step))

    def release_now(self, job_id: str, exclude: list[str] | None = None) -> None:
        self.calls.append(("release_now", job_id, *(exclude or [])))

    def set_admin_comment(self, job_id: str, text: str) -> None:
        self.calls.append(("set_admin_comment", job_id, text))
        if job_id not in self.jobs:
            raise SlurmError(f"job {job_id}: Invalid job id specified")
        self.jobs[job_id]["AdminComment"] = text

    def recall_abilities(self, state_dir: str) -> None:
        pass  # a fake has no scontrol to find out about

    def remember_abilities(self, state_dir: str) -> None:
        pass

    def did(self, what: str) -> list[tuple[str, ...]]:
        return [c for c in self.calls if c[0] == what]
