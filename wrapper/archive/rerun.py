"""The manifest's reproducibility sections, derived from what the hooks already recorded.

Nothing here measures anything again or reads a user's file: it reads the job's events
(root's ``health`` and ``staging.in`` records; the task-prolog's ``environment`` claims
in the user's event file), the parts' facts and Slurm's job record.

* ``software``: the stack the version checks read (``wrapper.gpu.versions``): driver,
  CUDA, NCCL, Fabric Manager, site-listed commands, from root's ``health`` events.
* ``environment``: where the job's environment came from (the user's claims).
* ``data``: each staged tree with its digest (the node cache's key, or the files'
  checksums).
* ``seeds``: seed variables the job exported (claims).
* ``rerun``: one shell command line that submits the attempt again.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

from wrapper.job import events as ev

VERSION_CHECKS = ("driver", "cuda", "nccl", "fabric_manager", "commands")
_DRIVER = re.compile(r"^driver (\d+(?:\.\d+)+)")
_CUDA = re.compile(r"CUDA (\d+(?:\.\d+)+)")
_NCCL = re.compile(r"^NCCL (\d+(?:\.\d+)+) \((.*)\)")
_FABRIC = re.compile(r"(?:^Fabric Manager |, version )(\d+(?:\.\d+)+)")
_COMMAND = re.compile(r"^(\S+) (\d+(?:\.\d+)+)")


def software(events: Iterable[ev.Event]) -> dict[str, dict[str, Any]]:
    """``{node: stack}`` from root's latest ``health`` record on each node that carries
    the version checks' rows: ``{driver, cuda, nccl, nccl_path, fabric_manager, commands,
    checks: {check: status}, phase, attempt, measured_at}`` (a value not read is null)."""
    out: dict[str, dict[str, Any]] = {}
    for event in events:
        if not event.from_root or not isinstance(event, ev.Health) or not event.versions:
            continue
        stack: dict[str, Any] = {"driver": None, "cuda": None, "nccl": None,
                                 "nccl_path": None, "fabric_manager": None, "commands": {},
                                 "checks": {}, "phase": event.phase,
                                 "attempt": event.attempt, "measured_at": event.ts}
        for row in event.versions:
            if isinstance(row, Mapping):
                _read_row(stack, str(row.get("check", "")), str(row.get("status", "")),
                          str(row.get("reason", "")))
        out[event.node] = stack
    return out


def _read_row(stack: dict[str, Any], check: str, status: str, reason: str) -> None:
    checks = stack["checks"]
    checks[check] = "fail" if "fail" in (checks.get(check), status) else status
    if check == "driver" and (m := _DRIVER.match(reason)):
        stack["driver"] = m.group(1)
    elif check == "cuda" and (m := _CUDA.search(reason)):
        stack["cuda"] = m.group(1)
    elif check == "nccl" and (m := _NCCL.match(reason)):
        stack["nccl"], stack["nccl_path"] = m.group(1), m.group(2)
    elif check == "fabric_manager" and (m := _FABRIC.search(reason)):
        stack["fabric_manager"] = m.group(1)
    elif check == "commands" and (m := _COMMAND.match(reason)):
        stack["commands"][m.group(1)] = m.group(2)


def environment(events: Iterable[ev.Event], attempt: int) -> dict[str, Any] | None:
    """The latest ``environment`` the task-prolog recorded in ``attempt`` (a later step
    sees what the batch script loaded or activated before it), labelled as the user's."""
    found = None
    for event in events:
        if isinstance(event, ev.TaskPrologContext) and event.attempt == attempt \
                and isinstance(event.extra.get("environment"), dict):
            found = event
    if found is None:
        return None
    from wrapper.archive.jobenv import sanitize

    return {"source": "user", "recorded_by": "task-prolog", "node": found.node[:256],
            "step": found.step[:64], "recorded_at": found.ts or None,
            **sanitize(found.extra["environment"])}


def data(events: Iterable[ev.Event], attempt: int) -> list[dict[str, Any]]:
    """The trees staged in for ``attempt`` (root's ``staging.in`` records), each once."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for event in events:
        if not event.from_root or not isinstance(event, ev.StagingIn) \
                or event.attempt != attempt:
            continue
        items = event.extra.get("items")  # the staging report's, in extra
        for item in items if isinstance(items, list) else []:
            if not isinstance(item, Mapping):
                continue
            digest, kind = tree_digest(item)
            entry = {"directive": item.get("directive"), "source": item.get("source"),
                     "dest": item.get("dest"), "files": item.get("files"),
                     "bytes": item.get("bytes"), "digest": digest, "digest_kind": kind,
                     "node": event.node}
            key = (str(item.get("directive")), str(digest))
            if key not in out or (out[key]["digest"] is None and digest):
                out[key] = entry
    return list(out.values())


def tree_digest(item: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(digest, kind) of a staged tree: the node cache's key (``cache_key``: what the
    ``[staging] cache_key`` mode hashes), else the sha256 of its files' sha256 sums
    (``files_sha256``, with ``[staging] verify = "sha256"``), else (None, None)."""
    key = item.get("cache_key")
    if isinstance(key, str) and key:
        return key, "cache_key"
    sums = item.get("checksums")
    if isinstance(sums, Mapping) and sums:
        blob = json.dumps(sorted((str(k), str(v)) for k, v in sums.items()),
                          separators=(",", ":")).encode("utf-8", "surrogateescape")
        return hashlib.sha256(blob).hexdigest(), "files_sha256"
    return None, None


def resume_point(events: Iterable[ev.Event], attempt: int) -> str | None:
    """The checkpoint ``attempt`` resumed from: root's pick for it (``resume.chosen``), or,
    for a job recorded before root picked, the one root's epilog found at the end of the
    attempt before it (``attempt.end``'s ``checkpoint_path``)."""
    chosen = ended = None
    for event in events:
        if not event.from_root:
            continue
        if isinstance(event, ev.ResumeChosen) and event.attempt == attempt and event.path:
            chosen = event.path
        elif isinstance(event, ev.AttemptEnd) and event.attempt == attempt - 1 \
                and event.checkpoint_path:
            ended = event.checkpoint_path
    return chosen or ended


def command(*, job_id: str, slurm: Mapping[str, Any], work_dir: str | None,
            script: str | None, seeds: Mapping[str, str], resume_from: str | None,
            attempt: int) -> dict[str, Any]:
    """``{attempt, command, resume_from, options, notes}``: one shell line that pipes the
    archived batch script (with its ``#SBATCH`` and ``#JOBWRAP`` lines) into ``sbatch``
    with the options Slurm's record keeps, the seeds and the resume point exported."""
    def text(key: str) -> str:
        value = str(slurm.get(key, "") or "")
        return "" if value in ("", "(null)", "N/A", "None", "Unknown", "UNLIMITED") else value

    options: list[str] = []
    for flag, key in (("--job-name", "JobName"), ("--partition", "Partition"),
                      ("--account", "Account"), ("--qos", "QOS"), ("--time", "TimeLimit"),
                      ("--reservation", "Reservation"), ("--constraint", "Features")):
        if text(key):
            options.append(f"{flag}={text(key)}")
    tres = dict(t.partition("=")[::2] for t in text("ReqTRES").split(",") if "=" in t)
    # What the job asked for (ReqTRES node=N): NumNodes shrinks while nodes leave a
    # COMPLETING job, and the epilog of the last node may read it at 1.
    nodes = tres.get("node", "") or text("NumNodes")
    if re.fullmatch(r"\d+(-\d+)?", nodes):
        options.append(f"--nodes={nodes}")
    for flag, key in (("--ntasks", "NumTasks"), ("--cpus-per-task", "CPUs/Task")):
        if text(key).isdigit():
            options.append(f"{flag}={text(key)}")
    gres = re.sub(r"^gres[:/]", "", text("TresPerNode")).replace(",gres/", ",").replace(
        ",gres:", ",")
    if gres:
        options.append(f"--gres={gres}")
    elif tres.get("gres/gpu", "").isdigit():  # the job's GPUs in all
        options.append(f"--gpus={tres['gres/gpu']}")
    if text("MinMemoryNode") not in ("", "0"):  # 0 would ask for all of each node's memory
        options.append(f"--mem={text('MinMemoryNode')}")
    elif text("MinMemoryCPU") not in ("", "0"):
        options.append(f"--mem-per-cpu={text('MinMemoryCPU')}")
    if work_dir:
        options.append(f"--chdir={work_dir}")
    from wrapper.archive.jobenv import safe_seeds

    # Only seeds (a seed's name, a plain value) from the user's claims, however recorded:
    # never BASH_ENV, LD_PRELOAD or any variable another program acts on.
    kept = safe_seeds(dict(seeds))
    exports = [f"{k}={v}" for k, v in sorted(kept.items())]
    notes = []
    dropped = sorted(str(k)[:64] for k in seeds if k not in kept)[:20]
    if dropped:
        notes.append("not exported (only a seed's name with a plain value is): "
                     + ", ".join(shlex.quote(k) for k in dropped))
    if resume_from:
        exports.append(f"JOBWRAP_RESUME_FROM={resume_from}")
    unsafe = [e for e in exports if "," in e or "\n" in e]
    if unsafe:  # sbatch splits --export on commas: such a value cannot be passed there
        notes.append("not exported (a comma or a newline in the value): "
                     + ", ".join(e.partition("=")[0] for e in unsafe))
        exports = [e for e in exports if e not in unsafe]
    if exports:
        options.append("--export=" + ",".join(["ALL", *exports]))
    line = None
    if script:
        line = f"gzip -dc {shlex.quote(script)} | sbatch {shlex.join(options)}".rstrip()
    else:
        notes.append(f"the batch script of job {job_id} is not in the archive")
    notes.append("the environment is the submitting shell's (sbatch --export=ALL): load "
                 "the modules / activate the env the manifest's environment names first")
    return {"attempt": attempt, "command": line, "resume_from": resume_from,
            "options": options, "notes": notes}
