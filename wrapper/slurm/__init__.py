"""The Slurm adapter: the only code in jobwrap that speaks to Slurm.

``backend(config)`` returns the backend the config asks for: Slurm's commands by
default, pyslurm only where it imports and matches the running Slurm.
"""

from __future__ import annotations

from typing import Protocol

from wrapper.config import SlurmConfig
from wrapper.errors import SlurmError
from wrapper.runner import Runner
from wrapper.slurm.commands import CliBackend, drain_reason
from wrapper.slurm.context import JobContext, from_env

__all__ = ["CliBackend", "JobContext", "SlurmBackend", "backend", "drain_reason", "from_env"]


class SlurmBackend(Protocol):
    name: str

    def version(self) -> str: ...
    def batch_script(self, job_id: str) -> str: ...
    def job_info(self, job_id: str) -> dict[str, str]: ...
    def node_info(self, node: str) -> dict[str, str]: ...
    def nodes_info(self, nodes: list[str]) -> dict[str, dict[str, str]]: ...
    def drain_node(self, node: str, reason: str) -> str: ...
    def resume_node(self, node: str) -> None: ...
    def requeue(self, job_id: str, *, hold: bool = False, eligible_now: bool = False) -> None: ...
    def exclude_nodes(self, job_id: str, nodes: list[str]) -> list[str]: ...
    def shrink_job(self, job_id: str, keep: list[str]) -> None: ...
    def job_state(self, job_id: str) -> str: ...
    def job_state_and_limit(self, job_id: str) -> tuple[str, str]: ...
    def job_steps(self, job_id: str) -> list[str]: ...
    def signal_job(self, job_id: str, signal: str, *, full: bool = False) -> None: ...
    def kill_steps(self, job_id: str) -> list[str]: ...
    def release_now(self, job_id: str, exclude: list[str] | None = None) -> None: ...
    def set_admin_comment(self, job_id: str, text: str) -> None: ...
    def recall_abilities(self, state_dir: str) -> None: ...
    def remember_abilities(self, state_dir: str) -> None: ...


_warned: list[str] = []


def backend(config: SlurmConfig, runner: Runner | None = None) -> SlurmBackend:
    cli = CliBackend(config, runner)
    if config.backend == "cli":
        return cli
    from wrapper.slurm.pyslurm_backend import PyslurmBackend, load_matching

    module, why = load_matching(cli.version)
    if module is not None:
        return PyslurmBackend(module, config, runner)
    if config.backend == "pyslurm":
        raise SlurmError(f"[slurm] backend = \"pyslurm\" but {why}; set backend = \"cli\"")
    if ("does not match" in why or "SLURM_CONF" in why) and not _warned:  # one line
        from wrapper import log

        _warned.append(why)
        hint = " (install the pyslurm release of this Slurm)" if "match" in why else ""
        log.get().warning("slurm.backend", backend="cli",
                          why=f"{why}; using Slurm's commands{hint}")
    return cli
