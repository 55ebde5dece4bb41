"""Builders of the archive tests (no tests or fixtures of its own: those are in
tests/unit/conftest.py and tests/unit/archive/conftest.py).

The archive reads job files with the job user's rights, so these tests run as root with
a real non-root user, ``jwtest``, as CI does.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from tests import support
from wrapper.archive import store
from wrapper.archive._fs import Access
from wrapper.archive.status import AttemptSummary, summarize
from wrapper.cli import cli
from wrapper.config import Config, parse
from wrapper.job import events as ev
from wrapper.job.record import JobRecord
from wrapper.job.state import JobState
from wrapper.osl.users import UserIds

USER = support.USER


def config(base: Path, **archive: Any) -> Config:
    """A config whose state, archive and log live under ``base``."""
    lines = [f'[paths]\nstate_dir = "{base}/state"\narchive_root = "{base}/archive"',
             f'[log]\nfile = "{base}/jobwrap.log"', "[archive]"]
    for key, value in archive.items():
        rendered = f'"{value}"' if isinstance(value, str) else \
            ("true" if value is True else "false" if value is False else repr(value))
        if isinstance(value, tuple):
            rendered = "[" + ", ".join(f'"{v}"' for v in value) + "]"
        lines.append(f"{key} = {rendered}")
    return parse("\n".join(lines).encode(), str(base / "config.toml"))


def config_file(base: Path, archive: str = "") -> str:
    """A config file for the CLI, ``base/config.toml``: state and archive under ``base``,
    no log file, ``archive`` the lines of its ``[archive]`` table; everyone may read it."""
    path = base / "config.toml"
    path.write_text(f'[paths]\nstate_dir = "{base}/state"\narchive_root = "{base}/archive"\n'
                    f'[log]\nfile = ""\n[archive]\n{archive}')
    os.chmod(path, 0o644)
    return str(path)


def work_dir(base: Path, user: UserIds) -> Path:
    work = base / "work"
    work.mkdir(exist_ok=True)
    os.chown(work, user.uid, user.gid)
    return work


def user_file(path: Path, user: UserIds, text: str) -> Path:
    path.write_text(text)
    os.chown(path, user.uid, user.gid)
    return path


def record(base: Path, user: UserIds, job_id: str = "42", **fields: Any) -> JobRecord:
    values: dict[str, Any] = {
        "job_id": job_id, "user": user.name, "uid": user.uid, "gid": user.gid,
        "nodes": ["n1", "n2"], "gpus": [0, 1], "work_dir": str(base / "work"),
        "stdout": str(base / "work" / f"job-{job_id}.out"), "stderr": "",
        "time_limit_s": 3600.0, **fields}
    return JobRecord(**values)


def state(base: Path, user: UserIds, job_id: str = "42") -> JobState:
    job = JobState(base / "state", job_id)
    job.prepare(user.uid, user.gid)
    return job


def run_attempt(job: JobState, attempt: int, nodes: list[str], *, kind: str = "success",
                decision: str = "done", checkpoints: tuple[int, ...] = ()) -> None:
    """Record one attempt's events the way the hooks and the supervisor write them."""
    for node in nodes:
        job.append("prolog.context", node=node, hook="prolog", attempt=attempt,
                   context={"nodes": nodes, "attempt": attempt, "partition": "gpu"})
        job.append("health", node=node, attempt=attempt, phase="prolog", verdict="pass",
                   failures=[], warnings=[])
    for step in checkpoints:
        job.append("checkpoint", as_user=True, attempt=attempt, hook="supervisor",
                   path=f"/ckpt/step-{step}", step=step)
    for node in nodes:
        job.append("epilog.context", node=node, hook="epilog", attempt=attempt,
                   context={"nodes": nodes, "attempt": attempt})
    job.append("attempt.end", node=nodes[0], attempt=attempt, kind=kind,
               detail=f"{kind} detail", exit_code=0 if kind == "success" else 1,
               exit_signal=0, slurm_state="", decision=decision, reason=f"{decision} reason",
               exclude=[], checkpoint_step=checkpoints[-1] if checkpoints else None,
               checkpoint_path=f"/ckpt/step-{checkpoints[-1]}" if checkpoints else None)


def summarized(records: list[dict[str, Any]]) -> list[AttemptSummary]:
    """The attempts told from event records, decoded as the store and the manifest decode
    them (``ev.decode_attempts``)."""
    return summarize(ev.decode_attempts(records))


def jobwrap(config_path: str, *args: str) -> tuple[int, str]:
    """``jobwrap --config CONFIG_PATH ARGS...`` in-process: its exit code and output."""
    result = CliRunner().invoke(cli, ["--config", config_path, *args])
    return result.exit_code, result.output


NOW = time.time()  # the index tests' clock: a job's age is counted from here


def write_job(root: Path, user_name: str, job_id: str, *, age_s: float = 600.0,
              kinds: tuple[str, ...] = ("success",), nodes: tuple[str, ...] = ("n1",),
              gid: int = 0, slow: dict[str, float] | None = None) -> dict[str, Any]:
    """One job archived through the project's Writer (it spools the job's record);
    ``slow``: the nodes its pulse named slow in every attempt, with their scores."""
    updated = NOW - age_s  # NOW: this module's import, as the tests' ages are counted
    attempts = [{"attempt": n, "status": "ended", "nodes": list(nodes),
                 "started_at": updated - 3600 * (len(kinds) - n),
                 "ended_at": updated - 3600 * (len(kinds) - n) + 3000, "outcome": kind,
                 "checkpoint_list": [{"ts": updated - 3600 * (len(kinds) - n) + 1000,
                                      "step": 10 * (n + 1), "path": f"/c/{n}"}],
                 **({"speed": dict(slow), "slow": sorted(slow)} if slow else {})}
                for n, kind in enumerate(kinds)]
    manifest = {"schema_version": 1, "updated_at": updated,
                "job": {"id": job_id, "name": f"train-{job_id}", "user": user_name, "uid": 0},
                "attempts": attempts, "archive": {"complete": True}}
    with store.Writer(str(root), user_name, job_id, nodes[0], Access(gid=gid)) as writer:
        for number in range(len(kinds)):
            writer.write_part(number, {"archived_at": updated, "complete": True})
        writer.commit(lambda parts: manifest)
    return manifest
