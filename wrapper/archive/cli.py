"""``jobwrap archive list|show|extract|prune|index|reindex``, and the attempts
``jobwrap status JOBID`` tells (``job_attempts``; the command is ``wrapper.goodput.cli``'s,
for it adds the job's goodput ledger and advice, which build on the archive).

``--json`` output is a stable shape (keys are only ever added): ``archive list`` prints
``[{user, job_id, path, updated_at, size, complete, name, attempts}]``; ``archive show``
prints the manifest itself (docs/manifest.md); ``archive prune`` prints the removals,
each an archive of ``list`` plus ``reason`` (age | size).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from wrapper import config as config_mod
from wrapper.archive import parts, store
from wrapper.archive import status as status_mod
from wrapper.config import Config
from wrapper.errors import FormatTooNew, JobwrapError, UserInputError
from wrapper.fastdataclass import dataclass
from wrapper.job.store import JobStore

if TYPE_CHECKING:
    from wrapper.archive.index import Index


def current_config() -> Config:
    root = click.get_current_context().find_root()
    path: str | None = (root.obj or {}).get("config_path")
    return config_mod.load(path)


@click.group()
def archive() -> None:
    """List, show, extract and prune the archives of ended jobs (logs and manifest)."""


@archive.command("list")
@click.option("--user", metavar="NAME", default=None, help="Only this user's archives.")
@click.option("--since", metavar="WHEN", default=None,
              help="Only archives written since WHEN: a date (2024-05-01), a date and time "
                   "(2024-05-01T12:00) or a time back from now (12h, 7d).")
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
def list_archives(user: str | None, since: str | None, as_json: bool) -> None:
    """One line per archived job, oldest first."""
    cfg = current_config()
    start = parse_since(since, time.time()) if since else None
    index = open_index(cfg)
    found = index.stream(since=start, user=user) if index is not None else \
        iter(store.list_archives(cfg.paths.archive_root, user=user, since=start))
    first = next(found, None)
    if as_json:  # json.dumps(list, indent=2), one job at a time
        click.echo("[]" if first is None else "[")
        for n, info in enumerate(itertools.chain([first] if first else [], found)):
            text = json.dumps(info.as_dict(), indent=2).replace("\n", "\n  ")
            click.echo((",\n  " if n else "  ") + text, nl=False)
        if first is not None:
            click.echo("\n]")
        return
    if first is None:
        click.echo("no archives", err=True)
        return
    click.echo(f"{'JOBID':<12} {'USER':<12} {'UPDATED':<19} {'SIZE':>9} {'TRIES':>5} "
               f"{'STATE':<10} NAME")
    for info in itertools.chain([first], found):
        click.echo(f"{info.job_id:<12} {info.user:<12} {_clock(info.updated_at):<19} "
                   f"{_size(info.size):>9} {len(info.attempts):>5} "
                   f"{'complete' if info.complete else 'incomplete':<10} {info.name}")


@archive.command()
@click.argument("job_id")
@click.option("--user", metavar="NAME", default=None, help="The job's user (faster lookup).")
@click.option("--json", "as_json", is_flag=True, help="The whole manifest, as JSON.")
@click.option("--rerun", is_flag=True,
              help="Print only the command line that submits the job's latest attempt again.")
@click.option("--attempt", type=click.IntRange(min=0), default=None, metavar="N",
              help="With --rerun: that attempt's command line instead of the latest's.")
def show(job_id: str, user: str | None, as_json: bool, rerun: bool,
         attempt: int | None) -> None:
    """Summarize an archived job's manifest: job, attempts, code, exit, files."""
    cfg = current_config()
    manifest = store.load_manifest(cfg.paths.archive_root, job_id, user)
    if rerun or attempt is not None:
        click.echo(rerun_line(manifest, attempt))
    elif as_json:
        click.echo(json.dumps(manifest, indent=2))
    else:
        click.echo(render_manifest(manifest), nl=False)


@archive.command()
@click.argument("job_id")
@click.argument("dest", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--user", metavar="NAME", default=None, help="The job's user (faster lookup).")
def extract(job_id: str, dest: str, user: str | None) -> None:
    """Copy a job's archive into DIR, decompressed; never overwrites a file."""
    cfg = current_config()
    written = store.extract(cfg.paths.archive_root, job_id, dest, user)
    click.echo(f"extracted {len(written)} files into {dest}")


@archive.command()
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
def prune(dry_run: bool, as_json: bool) -> None:
    """Remove whole job archives, oldest first, past [archive] max_age_days and max_total_gb."""
    cfg = current_config()
    index = open_index(cfg)
    limit = int(cfg.archive.max_total_gb * (1 << 30))
    oldest = index.stream() if index is not None else None
    with contextlib.closing(oldest) if oldest is not None else contextlib.nullcontext():
        removals = store.prune(cfg.paths.archive_root, cfg.archive.max_age_days, limit,
                               time.time(), dry_run=dry_run, archives=oldest,
                               total=index.total_size() if index is not None and limit
                               else None)
    if index is not None and not dry_run:
        index.forget(r.info for r in removals)
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in removals], indent=2))
        return
    verb = "would remove" if dry_run else "removed"
    for removal in removals:
        click.echo(f"{verb} {removal.info.path} ({_size(removal.info.size)}, "
                   f"{removal.reason})")
    freed = sum(r.info.size for r in removals)
    click.echo(f"{verb} {len(removals)} archives, {_size(freed)}", err=True)


@dataclass(frozen=True)
class JobAttempts:
    """A job's attempts as ``jobwrap status`` tells them, and where they were read."""

    attempts: list[status_mod.AttemptSummary]
    source: str  # "state": this node's per-job state; "archive": the job's manifest
    uid: int | None  # the job's user id, from the same source
    index: Index | None  # the archive's index, when it was opened to find the manifest


def job_attempts(cfg: Config, job_id: str) -> JobAttempts:
    """The attempts of a job from this node's state, else from its archived manifest
    (found through the index when this process may read it). Raises UserInputError when
    neither knows the job, FormatTooNew when its manifest is a newer jobwrap's."""
    job = JobStore.of(cfg, job_id)
    attempts = status_mod.timeline(job)
    if attempts:
        return JobAttempts(attempts, "state", job.state.job_uid(), None)
    index = open_index(cfg)
    try:
        manifest = _archived_manifest(cfg.paths.archive_root, job_id, index)
    except FormatTooNew:
        raise  # there is a record: a newer jobwrap's, and the message says so
    except JobwrapError:
        raise UserInputError(f"no record of job {job_id}: nothing in this node's state "
                             f"({cfg.paths.state_dir}) nor in the archive "
                             f"({cfg.paths.archive_root})") from None
    attempts = [status_mod.AttemptSummary.from_dict(a) for a in manifest.get("attempts")
                or []]
    return JobAttempts(attempts, "archive", _int((manifest.get("job") or {}).get("uid")),
                       index)


@archive.command("index")
@click.option("--rebuild", is_flag=True,
              help="Build the index again from every manifest (when it is missing or "
                   "damaged; it is also done on its own then).")
def index_cmd(rebuild: bool) -> None:
    """Fold the epilogs' spool into the archive's index (root; a timer's job)."""
    cfg = current_config()
    _indexer(cfg, rebuild)


@archive.command()
def reindex() -> None:
    """Build the archive's index again from every manifest (root)."""
    _indexer(current_config(), True)


def _indexer(cfg: Config, rebuild: bool) -> None:
    from wrapper.archive import index as index_mod

    root = cfg.paths.archive_root
    if not index_mod.may_read(root):
        raise UserInputError(f"only root (the owner of {root}) keeps the archive's index")
    if not os.path.isdir(root):
        raise UserInputError(f"the archive root {root} does not exist: nothing to index")
    index = index_mod.backend(cfg)
    started = time.monotonic()
    try:
        if rebuild:
            folded = index.rebuild(_say).folded
        else:
            try:
                index.check()
                folded = index.fold()
                click.echo(f"folded {folded} records into {index.path}", err=True)
            except index_mod.IndexDown as exc:  # nothing to rebuild: the server is away
                raise store.ArchiveError(f"{exc}; the spool keeps the records for the next "
                                         "run") from None
            except index_mod.IndexFault as exc:
                why = str(exc)
                folded = index.rebuild(lambda line: _say(
                    f"{why}: built it again from the manifests; {line}")).folded
                rebuild = True
        left = index_mod.record_run(root, folded=folded, seconds=time.monotonic() - started,
                                    rebuilt=rebuild)
    except OSError as exc:
        raise store.ArchiveError(f"cannot write the archive index {index.path}: "
                                 f"{exc.strerror or exc}") from None
    from wrapper import metrics

    metrics.record_indexer(cfg.metrics, folded=folded, left=left.records)
    if cfg.pulse.slow_drain_users > 0:  # the site's choice for nodes named slow
        from wrapper import slurm
        from wrapper.archive.slow import drain_named

        drain_named(cfg, index, slurm.backend(cfg.slurm), time.time(), _say)


def open_index(cfg: Config) -> Index | None:
    """The archive's index, fresh, when this process may read it (root), else None."""
    from wrapper.archive import index as index_mod

    return index_mod.reading(cfg, _say)


def _say(line: str) -> None:
    click.echo(f"jobwrap: {line}", err=True)


def _archived_manifest(root: str, job_id: str, index: Index | None) -> dict[str, Any]:
    """A job's manifest: its folder found through the index (one manifest read), else by
    trying each user's folder the caller may enter."""
    parts.check_job_id(job_id)
    users = index.locate(job_id) if index is not None else []
    for user in users:
        with contextlib.suppress(JobwrapError):
            return store.load_manifest(root, job_id, user)
    return store.load_manifest(root, job_id)


# -- helpers -------------------------------------------------------------------------------
def parse_since(text: str, now: float) -> float:
    """``--since``: an ISO date or date-time (local time), or a duration back from ``now``."""
    from wrapper.submit.directives import parse_duration

    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        pass
    try:
        return now - parse_duration(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither a date (2024-05-01, 2024-05-01T12:00) "
                                 "nor a duration (12h, 7d)", param_hint="--since") from None


def rerun_line(manifest: dict[str, Any], attempt: int | None = None) -> str:
    """The manifest's command line that reruns ``attempt`` (the latest when None)."""
    job = (manifest.get("job") or {}).get("id")
    entry = manifest.get("rerun")
    if attempt is not None:
        entry = next((a.get("rerun") for a in manifest.get("attempts") or []
                      if a.get("attempt") == attempt), None)
        if entry is None:
            raise UserInputError(f"job {job} has no attempt {attempt} in its archive")
    if not isinstance(entry, dict) or not entry.get("command"):
        why = "; ".join((entry or {}).get("notes") or []) if isinstance(entry, dict) else ""
        raise UserInputError(f"job {job}'s manifest has no rerun command"
                             + (f": {why}" if why else " (it was archived by an older "
                                "jobwrap; the batch script may still be in the archive)"))
    return str(entry["command"])


def render_manifest(manifest: dict[str, Any]) -> str:
    """A manifest, summarized for a terminal."""
    job = manifest.get("job") or {}
    lines = [f"job {job.get('id')}" + (f" ({job['name']})" if job.get("name") else "")
             + f"  user {job.get('user')}"
             + (f"  account {job['account']}" if job.get("account") else "")
             + (f"  partition {job['partition']}" if job.get("partition") else "")]
    times = [f"{label} {_clock(job[key])}" for key, label in
             (("submit_time", "submitted"), ("start_time", "started"), ("end_time", "ended"))
             if job.get(key)]
    if times:
        lines.append("  ".join(times))
    gpus = job.get("gpus") or {}
    if gpus:
        lines.append("gpus " + "; ".join(f"{node}: {_gpus(v)}" for node, v in gpus.items()))
    code = manifest.get("code") or {}
    if code.get("repository"):
        dirty = "" if code.get("dirty") is None else \
            f", dirty ({code.get('changes')} changes)" if code["dirty"] else ", clean"
        lines.append(f"code {code.get('work_dir')} at {code.get('commit') or 'no commit'}"
                     f"{dirty}")
    elif code:
        lines.append(f"code {code.get('work_dir')}: not a git repository"
                     + (f" ({code['error']})" if code.get("error") else ""))
    lines += _reproduction(manifest)
    tool = manifest.get("jobwrap") or {}
    lines.append(f"jobwrap {tool.get('version')}, config {tool.get('config_digest')}")
    info = manifest.get("archive") or {}
    missing = ", ".join(f"attempt {m['attempt']} on {m['node']}" for m in info.get("missing")
                        or [])
    lines.append("archive complete" if info.get("complete") else
                 "archive INCOMPLETE" + (f": missing {missing}" if missing else
                                         ": a part ran out of time"))
    attempts = [status_mod.AttemptSummary.from_dict(a) for a in manifest.get("attempts") or []]
    text = "\n".join(lines) + "\n\n" + status_mod.render(str(job.get("id")), attempts)
    files = [f"  attempt-{a['attempt']}/{node}/{f['name']}  {f['status']}"
             + (f"  {_size(int(f.get('size') or 0))}" if f.get("size") else "")
             + ("  (truncated)" if f.get("truncated") else "")
             + (f"  ({f['error']})" if f.get("error") else "")
             for a in manifest.get("attempts") or []
             for node, node_files in sorted((a.get("files") or {}).items())
             for f in node_files if not f.get("same_as")]
    if files:
        text += "files\n" + "\n".join(files) + "\n"
    return text


def _reproduction(manifest: dict[str, Any]) -> list[str]:
    """Software, environment, packages, data and the rerun line, one line each."""
    lines = []
    for node, stack in sorted((manifest.get("software") or {}).items()):
        if isinstance(stack, dict):
            found = [f"{label} {stack[key]}" for key, label in
                     (("driver", "driver"), ("cuda", "CUDA"), ("nccl", "NCCL"),
                      ("fabric_manager", "Fabric Manager")) if stack.get(key)]
            lines.append(f"software {node}: " + (", ".join(found) or "nothing read"))
    env = manifest.get("environment") or {}
    if env:
        said = [f"modules {' '.join(env['modules'])}" if env.get("modules") else "",
                f"venv {env['venv']}" if env.get("venv") else "",
                f"conda {(env.get('conda') or {}).get('prefix')}" if env.get("conda") else "",
                "container " + ", ".join(f"{k}={v}" for k, v in env["container"].items())
                if env.get("container") else "",
                f"python {env['python']}" if env.get("python") else ""]
        lines.append("environment (the user's claim): "
                     + ("; ".join(s for s in said if s) or "nothing named"))
    python = manifest.get("python") or {}
    if python:
        lines.append(f"packages {len(python.get('pip') or [])} pip, "
                     f"{len(python.get('conda') or [])} conda, from {python.get('prefix')}"
                     + (f" ({python['error']})" if python.get("error") else ""))
    for item in manifest.get("data") or []:
        lines.append(f"data {item.get('directive')}: "
                     + (f"{item.get('digest_kind')} {item['digest']}" if item.get("digest")
                        else "no digest"))
    if manifest.get("seeds"):
        lines.append("seeds " + " ".join(f"{k}={v}" for k, v in manifest["seeds"].items()))
    rerun = manifest.get("rerun") or {}
    if rerun.get("command"):
        lines.append(f"rerun {rerun['command']}")
    return lines


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _gpus(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(g.get("uuid") or g.get("index")) if isinstance(g, dict) else str(g)
                         for g in value) or "none"
    return str(value)


def _clock(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover - the loop always returns
