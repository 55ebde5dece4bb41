"""The epilog's one call: archive this node's part of an attempt, inside a time budget.

``archive_attempt`` collects the node's files of the attempt (``collect``), records the
facts the epilog passes and the work dir's git state (``manifest.read_code``, first node
only), and stores the part and a rebuilt manifest atomically (``store.Writer``). It
also archives any earlier attempt of this node that has no part yet (its epilog was
killed mid-archive), marked ``recovered_by``. A user's bad file never makes it raise: what
could not be archived is recorded, with why, in the part, the manifest and the result.
It raises nothing for a broken archive root either: the result says so, and the epilog
goes on (the archive never blocks the removal of scratch).
"""

from __future__ import annotations

import grp
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field, replace
from pathlib import Path
from typing import Any

from wrapper import log
from wrapper.archive import manifest
from wrapper.archive._fs import Access, ArchiveError, write_json_atomic
from wrapper.archive.collect import (
    INCOMPLETE,
    MISSING,
    REFUSED,
    ArchivedFile,
    Limits,
    OutputSpec,
    Sources,
    collect,
)
from wrapper.archive.patterns import PatternValues, candidates
from wrapper.archive.store import Writer
from wrapper.config import ArchiveConfig, Config
from wrapper.errors import JobwrapError
from wrapper.fastdataclass import dataclass
from wrapper.job import events as ev
from wrapper.job.record import JobRecord
from wrapper.job.state import JobState
from wrapper.osl.users import UserIds

MIB = 1 << 20
MAX_PART_EVENTS = 5000  # the user's event file could be long; the manifest stays readable
_LEVELS = {"fast": 1, "default": 6, "best": 9}
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass
class ArchiveResult:
    """What ``archive_attempt`` did, for the epilog's log."""

    path: str                 # the job's archive folder ("" when nothing could be stored)
    complete: bool            # this node's part is stored, whole, and the manifest lists it
    files: list[ArchivedFile] = field(default_factory=list)  # this attempt's files here
    problems: list[str] = field(default_factory=list)  # what was not archived, and why
    recovered: list[int] = field(default_factory=list)  # earlier attempts archived now
    elapsed_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "complete": self.complete,
                "files": [f.as_dict() for f in self.files], "problems": self.problems,
                "recovered": self.recovered, "elapsed_s": self.elapsed_s}


def archive_attempt(cfg: Config, state: JobState, record: JobRecord, *, attempt: int, node: str,
                    script_text: str, extra: Mapping[str, Any], outputs: Sequence[str] = (),
                    clock: Callable[[], float] = time.monotonic) -> ArchiveResult:
    """Archive ``node``'s part of ``attempt`` of the job (root, in the epilog).

    ``script_text``: the batch script (``SlurmBackend.batch_script``; "" on nodes other
    than the first, or when unknown). ``extra``: facts for the manifest, each optional:
    ``slurm`` (``SlurmBackend.job_info``: JobName, Account, SubmitTime, ArrayJobId ...),
    ``gpus`` (this node's allocated GPUs: [{index, uuid, serial, ...}]), ``health`` (this
    node's verdict: {verdict, detail, phase, ...}), ``software`` (driver, CUDA, NCCL,
    baseline, Python packages ...), ``staging`` (the staging summary with checksums); any
    other key is kept in the part as it is. ``outputs``: further Slurm filename patterns
    to archive from this node, besides ``[archive] outputs``.
    """
    started = clock()
    if not cfg.archive.enabled:
        return ArchiveResult("", False, problems=["archiving is off ([archive] enabled = "
                                                  "false)"])
    logger = log.get()
    try:
        result = _archive(cfg, state, record, attempt=attempt, node=node,
                          script_text=script_text, extra=extra, outputs=outputs,
                          deadline=started + cfg.archive.budget, clock=clock)
    except (JobwrapError, OSError) as exc:
        problem = f"the archive could not be written: {_describe(exc)}"
        logger.error("archive.failed", error=problem)
        return ArchiveResult("", False, problems=[problem], elapsed_s=clock() - started)
    result.elapsed_s = round(clock() - started, 3)
    for problem in result.problems:
        logger.warning("archive.problem", problem=problem)
    logger.info("archive.done", path=result.path, complete=result.complete,
                files=len(result.files), recovered=result.recovered, took_s=result.elapsed_s)
    return result


def _archive(cfg: Config, state: JobState, record: JobRecord, *, attempt: int, node: str,
             script_text: str, extra: Mapping[str, Any], outputs: Sequence[str],
             deadline: float, clock: Callable[[], float]) -> ArchiveResult:
    settings = cfg.archive
    user = UserIds.of(record.uid, record.gid) if record.uid >= 0 else None
    access, root_mode, root_gid = access_for(settings, record.uid, record.gid)
    records = state.events()  # the lines as written: each part keeps its attempt's copy
    events = ev.decode_attempts(records)
    facts = json.loads(json.dumps(dict(extra), default=str))  # JSON-safe from here on
    limits = Limits(max_file_bytes=settings.max_file_mb * MIB,
                    compress_level=_LEVELS[settings.compression],
                    hook_log_scan_bytes=settings.hook_log_scan_mb * MIB, deadline=deadline,
                    clock=clock)
    user_name = record.user or (user.name if user else str(record.uid))
    result = ArchiveResult("", complete=True)
    with Writer(cfg.paths.archive_root, user_name, record.job_id, node, access,
                root_mode=root_mode, root_gid=root_gid,
                lock_timeout=max(5.0, deadline - clock())) as writer:
        todo = [attempt] + [a for a in _earlier_attempts(events, node, attempt)
                            if not writer.has_part(a, node)]
        for number in todo:
            sources = Sources(
                job_id=record.job_id, attempt=number, state=state,
                events=_of_attempt(records, number), user=user,
                outputs=output_specs(record, facts.get("slurm") or {}, node,
                                     [*settings.outputs, *outputs]),
                script_text=script_text, hook_log=cfg.log.file)
            files = collect(writer.part_dir(number), access, sources, limits)
            problems = _problems(files)
            part_complete = not any(f.status in INCOMPLETE for f in files)
            result.complete = result.complete and part_complete
            current = number == attempt
            code = python = None
            if current and node == (record.first_node or node) and user is not None:
                code = manifest.read_code(user, record.work_dir,
                                          min(settings.git_timeout, max(0.1, deadline - clock())))
                python = _packages(user, events, number,
                                   min(settings.git_timeout, max(0.1, deadline - clock())))
            _write_verdicts(writer.part_dir(number), sources.events, access)
            writer.write_part(number, {
                "archived_at": time.time(), "complete": part_complete,
                "recovered_by": None if current else attempt,
                "files": [f.as_dict() for f in files], "extra": facts if current else {},
                "gpus": (facts.get("gpus") or list(record.gpus)) if current else None,
                "code": code, "python": python, "events": sources.events, "problems": problems})
            if current:
                result.files, result.problems = files, problems
            else:
                result.recovered.append(number)
        digest, source = cfg.digest(), cfg.source
        result.path = writer.commit(lambda parts: manifest.build(
            record=record, parts=parts, events=records, config_digest=digest,
            config_source=source, now=time.time(),
            archive_dir=str(Path(cfg.paths.archive_root) / user_name / record.job_id)))
    return result


def _packages(user: UserIds, events: list[ev.Event], attempt: int,
              timeout: float) -> dict[str, Any] | None:
    """The package set of the Python the job's environment claims (``jobenv``), read as
    the job's user without running it; None when the task-prolog recorded nothing."""
    from wrapper.archive import jobenv, rerun

    found = rerun.environment(events, attempt)
    if found is None:
        return None
    return jobenv.read_packages(user, found, timeout)


def access_for(settings: ArchiveConfig, uid: int, gid: int) -> tuple[Access, int, int]:
    """How archives are owned: (access of job folders, mode of the root, group of the root)."""
    if settings.access in ("user", "acl"):  # "acl": the former name of "user"
        if uid < 0:
            raise ArchiveError("the job's user is not known: no one could be granted its archive")
        try:
            admins = grp.getgrnam(settings.admin_group).gr_gid
        except KeyError:
            raise ArchiveError(f"[archive] admin_group {settings.admin_group!r} is not a group "
                               "on this node") from None
        return Access(gid=admins, acl_uid=uid), 0o751, admins
    if gid < 0:
        raise ArchiveError("the job's group is not known: its archive would have no reader")
    return Access(gid=gid), 0o711, 0


def output_specs(record: JobRecord, slurm: Mapping[str, Any], node: str,
                 patterns: Sequence[str]) -> tuple[OutputSpec, ...]:
    """The job's files this node archives: stdout and stderr on the batch host (the first
    node, which writes them), and the further patterns on every node."""
    array_job = str(slurm.get("ArrayJobId") or "") or None
    array_task = str(slurm.get("ArrayTaskId") or "") or None
    base = PatternValues(job_id=record.job_id, user=record.user,
                         job_name=str(slurm.get("JobName") or ""), node=record.first_node or node,
                         array_job_id=array_job, array_task_id=array_task,
                         work_dir=record.work_dir)
    specs: list[OutputSpec] = []
    if node == (record.first_node or node):
        default = "slurm-%A_%a.out" if array_job else "slurm-%j.out"
        stdout = record.stdout or default
        specs.append(OutputSpec("stdout", "stdout.gz", tuple(candidates(stdout, base))))
        specs.append(OutputSpec("stderr", "stderr.gz",
                                tuple(candidates(record.stderr or stdout, base))))
    here = replace(base, node=node,
                   node_index=record.nodes.index(node) if node in record.nodes else 0)
    used = {"stdout.gz", "stderr.gz"}
    for pattern in patterns:
        where = tuple(candidates(pattern, here))
        name = "output-" + (_UNSAFE.sub("_", Path(where[0]).name).lstrip(".") or "file")
        stem, n = name, 1
        while f"{name}.gz" in used:
            n += 1
            name = f"{stem}-{n}"
        used.add(f"{name}.gz")
        specs.append(OutputSpec("output", f"{name}.gz", where))
    return tuple(specs)


def _write_verdicts(part_fd: int, records: list[dict[str, Any]], access: Access) -> None:
    """Root's verdicts among the part's records (the kinds a later attempt's nodes carry:
    archive/carry.py), in a small file of their own beside part.json; none, no file."""
    from wrapper.archive.carry import CARRIED
    from wrapper.archive.parts import PART_FORMAT, VERDICTS, VERDICTS_MAX, VERDICTS_MAX_BYTES

    kept = [r for r in records if r.get("source") == "root" and r.get("event") in CARRIED]
    kept = kept[-VERDICTS_MAX:]
    while kept and len(json.dumps(kept, default=str)) > VERDICTS_MAX_BYTES // 2:
        kept = kept[1:]  # the newest that fit (each is root's own, small)
    if kept:
        write_json_atomic(part_fd, VERDICTS, {"format": PART_FORMAT, "records": kept}, access)


def _earlier_attempts(events: list[ev.Event], node: str, attempt: int) -> list[int]:
    """Earlier attempts whose hooks ran on this node (root's records only)."""
    found = {e.attempt for e in events
             if e.from_root and e.node == node
             and isinstance(e, (ev.PrologContext, ev.EpilogContext)) and e.attempt < attempt}
    return sorted(found)


def _of_attempt(records: list[dict[str, Any]], attempt: int) -> list[dict[str, Any]]:
    """The attempt's event records, as written (the part's copy, decoded when the manifest
    reads it): every one of root's, and the user's last ones up to the bound (a user who
    writes thousands of small events cannot push root's out)."""
    mine = [e for e in records if ev.attempt_of(e) == attempt]
    roots = [e for e in mine if e.get("source") == "root"]
    users = [e for e in mine if e.get("source") != "root"]
    roots = roots[-MAX_PART_EVENTS:]
    room = MAX_PART_EVENTS - len(roots)
    kept = {id(e) for e in roots} | {id(e) for e in (users[-room:] if room else [])}
    return [e for e in mine if id(e) in kept]


def _problems(files: list[ArchivedFile]) -> list[str]:
    out = []
    for f in files:
        noteworthy = f.status in (REFUSED, *INCOMPLETE) or (
            f.status == MISSING and f.kind in ("stdout", "stderr", "output"))
        if noteworthy:
            out.append(f"{f.kind} {f.source or f.name}: {f.status}"
                       + (f" ({f.error})" if f.error else ""))
    return out


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}" + (f": {exc.filename}" if exc.filename else "")
    return str(exc)
