"""``manifest.json``: everything needed to rerun or debug a job, in one versioned document.

Built from the job's events (what the hooks and the supervisor recorded), its record
(``job.json``) and the parts of its archive (one per attempt and node: the files archived
there and the facts the epilog passed in). Rebuilt, and rewritten atomically, each time
a part is added, so it always describes what the archive holds. Times are seconds since
the epoch (floats); a value that is not known is ``null``. ``schema_version`` changes
only when a field changes meaning or goes away; fields are only ever added otherwise.

Schema (version 1; ``docs/manifest.md`` says the same at more length)::

    schema_version   1
    generator        {name: "jobwrap", version}
    updated_at       when this manifest was written
    job              id, array_job_id, array_task_id, name, user, uid, gid, account, qos,
                     partition, nodes (of the latest attempt), gpus ({node: [GPU]}: what the
                     epilog passed, e.g. {index, uuid, serial}, else Slurm's GPU indices),
                     limits ({time_limit_s, time_limit, req_tres, alloc_tres, min_memory,
                     num_cpus}, those known), submit_time, start_time, end_time (only once
                     the job is over), work_dir, stdout, stderr, options (its #JOBWRAP
                     directives), options_error
    attempts         one per attempt, in order: attempt, status (running | ending | ended),
                     nodes, started_at, ended_at, health ([{node, phase, verdict, detail}]),
                     checkpoints (count), latest_step, latest_checkpoint, checkpoint_list
                     ([{path, step, ts}]), incidents (hang, GPU fault, walltime signal),
                     outcome (the failure class: success, hardware, hang, ...), detail,
                     exit_code, exit_signal, slurm_state, decision (requeue | stop | done),
                     reason, excluded (nodes), staging ({node: summary}), code (the git
                     facts read at its end), files ({node: [file]}), parts ({node:
                     {archived_at, complete, recovered_by, problems}})
    software         {node: {driver, cuda, nccl, nccl_path, fabric_manager, commands, checks,
                     phase, attempt, measured_at}}: what root's version checks read
                     (its latest ``health`` record there), plus what the epilog passed
    environment      the latest attempt's task-prolog claims (modules, container, conda,
                     venv, python, seeds), ``source: "user"``
    python           {kind, prefix, python_version, site_packages, pip, conda, truncated,
                     error}: the job Python's packages, read as the user, running nothing
    data             [{directive, source, dest, files, bytes, digest, digest_kind, node}]
    seeds            {name: value} (claims)
    rerun            {attempt, command, resume_from, options, notes} of the latest attempt
                     (each attempt also has its own environment, data, python and rerun)
    code             the latest attempt's git facts: {work_dir, repository, commit, branch,
                     dirty, changes, error}, read from .git (no git is run)
    jobwrap          {version, config_digest, config_source}
    exit             the latest attempt's end: {attempt, status, outcome, exit_code,
                     exit_signal, slurm_state, decision, final (no attempt will follow)}
    archive          {complete, parts: [{attempt, node, archived_at, complete,
                     recovered_by}], missing: [{attempt, node}]}: complete when every node
                     of every attempt that has ended has its part, and no part ran out
                     of time

A file is ``{name, kind, source, status, size, source_size, stored, sha256, truncated,
same_as, error}`` (``wrapper.archive.collect.ArchivedFile``): status is archived, partial,
missing, refused (the job's user could not read it, or it is no regular file) or skipped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from wrapper import __version__
from wrapper.archive import gitfacts, rerun
from wrapper.archive.status import ENDED, RUNNING, AttemptSummary, event_order, summarize
from wrapper.errors import JobwrapError
from wrapper.job import events as ev
from wrapper.job.record import JobRecord
from wrapper.osl.child import call_as
from wrapper.osl.users import UserIds
from wrapper.slurm.records import slurm_timestamp

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"


def build(*, record: JobRecord, parts: list[dict[str, Any]],
          events: Iterable[Mapping[str, Any]], config_digest: str, config_source: str,
          now: float, archive_dir: str = "") -> dict[str, Any]:
    """The manifest of a job from its record, event records (this node's, and those the
    parts archived: decoded here, once merged) and the archive's parts; ``archive_dir``
    (the job's archive folder) makes the rerun command name its script."""
    parts = sorted(parts, key=lambda p: (int(p.get("attempt", 0)), str(p.get("node", ""))))
    merged = merge_events([*events, *(e for p in parts for e in p.get("events") or [])])
    summaries = summarize(merged)
    attempts = {s.attempt: s.as_dict() for s in summaries}
    slurm: dict[str, Any] = {}
    software: dict[str, Any] = dict(rerun.software(merged))
    gpus: dict[str, Any] = {}
    for part in parts:
        number, node = int(part.get("attempt", 0)), str(part.get("node", ""))
        extra = part.get("extra") or {}
        entry = attempts.setdefault(number, AttemptSummary(number).as_dict())
        entry.setdefault("files", {})[node] = part.get("files") or []
        entry.setdefault("parts", {})[node] = {
            "archived_at": part.get("archived_at"), "complete": bool(part.get("complete")),
            "recovered_by": part.get("recovered_by"), "problems": part.get("problems") or []}
        if extra.get("staging") is not None:
            entry.setdefault("staging", {})[node] = extra["staging"]
        if isinstance(extra.get("health"), Mapping):
            report = dict(extra["health"])
            entry["health"].append({"node": node, "phase": str(report.pop("phase", "prolog")),
                                    "verdict": str(report.pop("verdict", "")),
                                    "detail": str(report.pop("detail", "")), **report})
        if part.get("code") is not None:
            entry["code"] = part["code"]
        slurm.update(extra.get("slurm") or {})
        if isinstance(extra.get("software"), Mapping):
            software[node] = {**software.get(node, {}), **extra["software"]}
        if part.get("python") is not None:
            entry["python"] = part["python"]
        if part.get("gpus") is not None:
            gpus[node] = part["gpus"]
    ordered = [attempts[n] for n in sorted(attempts)]
    for entry in ordered:
        entry.setdefault("staging", {})
        entry.setdefault("code", None)
        entry.setdefault("files", {})
        entry.setdefault("parts", {})
        entry.setdefault("python", None)
        _reproduction(entry, merged, slurm, record, archive_dir)
    last = ordered[-1] if ordered else None
    final = bool(last and last["status"] == ENDED and last.get("decision") != "requeue")
    return {
        "schema_version": SCHEMA_VERSION,
        "generator": {"name": "jobwrap", "version": __version__},
        "updated_at": now,
        "job": _job(record, slurm, gpus, ordered, final, _partition(merged)),
        "attempts": ordered,
        "software": software,
        "environment": last["environment"] if last else None,
        "python": next((a["python"] for a in reversed(ordered) if a.get("python")), None),
        "data": last["data"] if last else [],
        "seeds": (last["environment"] or {}).get("seeds") or {} if last else {},
        "rerun": last["rerun"] if last else None,
        "code": next((a["code"] for a in reversed(ordered) if a.get("code")), None),
        "jobwrap": {"version": __version__, "config_digest": config_digest,
                    "config_source": config_source},
        "exit": _exit(last, final),
        "archive": _completeness(summaries, parts),
    }


def _reproduction(entry: dict[str, Any], events: list[ev.Event], slurm: dict[str, Any],
                  record: JobRecord, archive_dir: str) -> None:
    """An attempt's environment (the user's claims), staged data and rerun command."""
    number = int(entry["attempt"])
    entry["environment"] = rerun.environment(events, number)
    entry["data"] = rerun.data(events, number)
    script = next((f"attempt-{number}/{node}/{f.get('name')}"
                   for node, files in sorted((entry.get("files") or {}).items())
                   for f in files if f.get("kind") == "script"
                   and f.get("status") == "archived"), None)
    if script and archive_dir:
        script = os.path.join(archive_dir, script)
    seeds = (entry["environment"] or {}).get("seeds") or {}
    entry["rerun"] = rerun.command(
        job_id=record.job_id, slurm=slurm, work_dir=record.work_dir or None, script=script,
        seeds={str(k): str(v) for k, v in seeds.items()} if isinstance(seeds, dict) else {},
        resume_from=rerun.resume_point(events, number), attempt=number)


def merge_events(records: Iterable[Mapping[str, Any]]) -> list[ev.Event]:
    """Event records from several nodes' views, each once, decoded (``ev.decode_attempts``:
    a record that names no attempt is left out) in time order."""
    seen: dict[str, Mapping[str, Any]] = {}
    for record in records:
        key = json.dumps([record.get("ts"), record.get("event"), record.get("node"),
                          record.get("attempt"), record.get("source")], default=str)
        seen.setdefault(key, record)
    # a made-up ts of the user's never raises
    return sorted(ev.decode_attempts(seen.values()), key=event_order)


def _partition(events: list[ev.Event]) -> str | None:
    for event in events:
        if event.from_root and isinstance(event, (ev.PrologContext, ev.EpilogContext)) \
                and event.context.get("partition"):
            return str(event.context["partition"])
    return None


def _job(record: JobRecord, slurm: dict[str, Any], gpus: dict[str, Any],
         attempts: list[dict[str, Any]], final: bool, partition: str | None) -> dict[str, Any]:
    def text(key: str) -> str | None:
        value = str(slurm.get(key, "") or "")
        return value if value and value not in ("(null)", "N/A", "None", "Unknown") else None

    limits = {"time_limit_s": record.time_limit_s, "time_limit": text("TimeLimit"),
              "req_tres": text("ReqTRES"), "alloc_tres": text("AllocTRES"),
              "min_memory": text("MinMemoryNode") or text("MinMemoryCPU"),
              "num_cpus": text("NumCPUs")}
    first_start = next((a["started_at"] for a in attempts if a.get("started_at")), None)
    end_time = None
    if final:
        end_time = _time(text("EndTime")) or (attempts[-1].get("ended_at") if attempts else None)
    partition = text("Partition") or partition
    return {
        "id": record.job_id,
        "array_job_id": text("ArrayJobId"), "array_task_id": text("ArrayTaskId"),
        "name": text("JobName"), "user": record.user, "uid": record.uid, "gid": record.gid,
        "account": text("Account"), "qos": text("QOS"), "partition": partition,
        "nodes": list(record.nodes), "gpus": gpus,
        "limits": {k: v for k, v in limits.items() if v is not None},
        "submit_time": _time(text("SubmitTime")),
        "start_time": record.start_time or _time(text("StartTime")) or first_start,
        "end_time": end_time,
        "work_dir": record.work_dir, "stdout": record.stdout, "stderr": record.stderr,
        "options": record.options, "options_error": record.options_error,
    }


def _exit(last: dict[str, Any] | None, final: bool) -> dict[str, Any] | None:
    if last is None:
        return None
    return {"attempt": last["attempt"], "status": last["status"], "outcome": last["outcome"],
            "exit_code": last["exit_code"], "exit_signal": last["exit_signal"],
            "slurm_state": last["slurm_state"], "decision": last["decision"], "final": final}


def _completeness(summaries: list[AttemptSummary],
                  parts: list[dict[str, Any]]) -> dict[str, Any]:
    # Once an attempt ends, Slurm runs the epilog on every node of it: each owes a part.
    present = {(int(p.get("attempt", 0)), str(p.get("node", ""))) for p in parts}
    expected = {(s.attempt, node) for s in summaries if s.status != RUNNING
                for node in s.nodes}
    missing = sorted(expected - present)
    return {
        "complete": not missing and all(bool(p.get("complete")) for p in parts),
        "parts": [{"attempt": p.get("attempt"), "node": p.get("node"),
                   "archived_at": p.get("archived_at"), "complete": bool(p.get("complete")),
                   "recovered_by": p.get("recovered_by")} for p in parts],
        "missing": [{"attempt": a, "node": n} for a, n in missing],
    }


def _time(text: str | None) -> float | None:
    return slurm_timestamp(text) if text else None


# -- the code that ran: git facts, read from .git as the job's user ---------------------------
def read_code(user: UserIds, work_dir: str, timeout: float) -> dict[str, Any]:
    """The work dir's git commit, branch and whether it has changes, read from ``.git``
    with the user's rights, running nothing of the user's (``wrapper.archive.gitfacts``).

    ``{work_dir, repository, commit, branch, dirty, changes, error}``; nothing here
    raises: a failure is reported in ``error``.
    """
    facts: dict[str, Any] = {"work_dir": work_dir, "repository": False, "commit": None,
                             "branch": None, "dirty": None, "changes": None, "error": ""}
    if not work_dir:
        facts["error"] = "the job's work dir is not known"
        return facts
    try:
        found: dict[str, Any] = call_as(user, _git_facts, work_dir, alarm=max(timeout, 0.1))
    except JobwrapError as exc:
        facts["error"] = f"reading git as {user.name} failed: {exc}"
        return facts
    facts.update(found)
    return facts


def _git_facts(work_dir: str) -> dict[str, Any]:
    """(Runs as the job user.) The facts, or ``{"error"}``; a hung file system ends the
    helper at ``read_code``'s ``timeout`` (``call_as``'s alarm)."""
    try:
        return gitfacts.read_facts(work_dir)
    except gitfacts.GitReadError as exc:
        return {"repository": True, "error": str(exc)}
    except OSError as exc:
        return {"error": f"{exc.strerror}: {exc.filename}" if exc.filename else str(exc)}
