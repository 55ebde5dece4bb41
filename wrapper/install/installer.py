"""What ``jobwrap install`` places for each node role, how it is written, and how
``jobwrap uninstall`` takes it back out (package docstring)."""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import field
from importlib import resources
from pathlib import Path
from typing import Any

from wrapper import __version__
from wrapper.errors import JobwrapError
from wrapper.fastdataclass import dataclass
from wrapper.install import slurmconf
from wrapper.osl.files import atomic_write

ROLES = ("compute", "controller", "login")
DEFAULT_PREFIX = "/opt/jobwrap"
DEFAULT_SYSTEMD_DIR = "/etc/systemd/system"
RECORD_NAME = "install.json"
RECORD_FORMAT = 1
# The hooks' own names in the shipped prolog/ and epilog/ folders, and which are programs.
_PROGRAMS = {"prolog", "task-prolog", "healthcheck", "epilog"}
# Units per role; the enabled ones are started by systemd (a template is started by the
# prolog, per job).
_UNITS = {"compute": [("jobwrap-supervisor@.service", False)],
          "login": [("jobwrap-login-guard.service", True)],
          "controller": [("jobwrap-indexer.service", False), ("jobwrap-indexer.timer", True)]}
_PLAIN_PATH = re.compile(r"/[\w./+=,:@-]*")


class InstallError(JobwrapError):
    """The install cannot go on; nothing was changed (or, for uninstall, the reason)."""


@dataclass
class FileStep:
    path: Path
    text: str
    mode: int
    what: str
    before: str | None  # what is there now (None: nothing)
    only_if_absent: bool = False  # the config: the site's own once it exists

    @property
    def changes(self) -> bool:
        return self.before is None if self.only_if_absent else self.before != self.text


@dataclass
class DirStep:
    path: Path
    mode: int
    what: str
    exists: bool
    kind: str = ""  # "data": jobs' data, kept by uninstall unless --purge; "archive": kept


@dataclass
class Plan:
    roles: list[str]
    prefix: Path
    program: Path
    files: list[FileStep]
    dirs: list[DirStep]
    enable: list[str]  # units to enable --now where systemd runs
    slurm_conf: Path | None
    edits: list[slurmconf.Edit]
    notes: list[str] = field(default_factory=list)

    @property
    def changes(self) -> bool:
        return any(f.changes for f in self.files) or any(not d.exists for d in self.dirs)


# -- reading what is there -----------------------------------------------------------------
def _read(path: Path) -> str | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InstallError(f"cannot look at {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise InstallError(f"{path} is not a regular file (a link or a folder?): move it "
                           "away or pass another path")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InstallError(f"cannot read {path}: {exc}") from None


def _shipped(folder: str) -> dict[str, str]:
    """The files of ``wrapper/ship/FOLDER`` as shipped (the wheel's package data)."""
    root = resources.files("wrapper") / "ship" / folder
    return {entry.name: entry.read_text(encoding="utf-8") for entry in root.iterdir()
            if entry.is_file() and not entry.name.startswith(".")}


def _check_plain(name: str, path: Path) -> None:
    if not path.is_absolute() or not _PLAIN_PATH.fullmatch(str(path)) or ".." in path.parts:
        raise InstallError(f"{name} {path}: give an absolute path of plain characters "
                           "(letters, digits and ./_+=,:@-), e.g. /opt/jobwrap")


def _check_ancestors(path: Path) -> None:
    """Root's files under a folder another user can change are not root's: each folder
    on the way, and on the way a link leads to."""
    real = Path(os.path.realpath(path))
    for parent in dict.fromkeys([path, *path.parents, real, *real.parents]):
        try:
            info = parent.stat()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise InstallError(f"cannot look at {parent}: {exc.strerror}") from None
        others = info.st_mode & 0o002 and not info.st_mode & stat.S_ISVTX
        group = info.st_mode & 0o020 and info.st_gid != 0 and not info.st_mode & stat.S_ISVTX
        if info.st_uid not in (0, os.geteuid()) or others or group:
            raise InstallError(f"{parent} can be changed by users other than root (owner "
                               f"uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}): "
                               f"root's hooks must not live under it; pick another place "
                               f"than {path}")


# -- the plan ------------------------------------------------------------------------------
def detect_roles(slurm_conf: Path | None, host: str) -> list[str]:
    """The host's roles from slurm.conf: a SlurmctldHost, a node's host, else login."""
    if slurm_conf is None or not slurm_conf.exists():
        return ["compute"]
    controller, nodes = slurmconf.host_nodes(slurm_conf, host)
    roles = (["compute"] if nodes else []) + (["controller"] if controller else [])
    return roles or ["login"]


def plan(*, roles: Iterable[str], prefix: Path, config_path: Path, slurm_conf: Path | None,
         systemd_dir: Path, program: Path, host: str | None = None) -> Plan:
    """Everything ``roles`` need on this host, and what is there now. Raises InstallError
    (or SlurmConfError) before anything is written when the install cannot go through."""
    from wrapper import config as config_mod

    roles = sorted(set(roles), key=ROLES.index)
    for name, path in (("--prefix", prefix), ("the config", config_path),
                       ("--systemd-dir", systemd_dir), ("the jobwrap program", program)):
        _check_plain(name, path)
    for path in (prefix, config_path.parent, systemd_dir, program.parent):
        _check_ancestors(path)
    host = host or socket.gethostname().split(".")[0]
    files: list[FileStep] = []
    dirs: list[DirStep] = []
    notes: list[str] = []

    def add_file(path: Path, text: str, mode: int, what: str, *, absent: bool = False) -> None:
        files.append(FileStep(path, text, mode, what, _read(path), absent))

    def add_dir(path: Path, mode: int, what: str, *, kind: str = "") -> None:
        if path not in [d.path for d in dirs]:
            dirs.append(DirStep(path, mode, what, path.is_dir(), kind))

    add_dir(prefix, 0o755, "the hooks' folder")
    for folder in ("prolog", "epilog"):
        add_dir(prefix / folder, 0o755, f"the {folder} hooks")
        for name, text in sorted(_shipped(folder).items()):
            add_file(prefix / folder / name, text, 0o755 if name in _PROGRAMS else 0o644,
                     f"the {name} hook" if name in _PROGRAMS else "the hooks' shared part")
    env = [f"JOBWRAP_BIN={program}", f"JOBWRAP_CONFIG={config_path}"]
    if slurm_conf is not None and str(slurm_conf) != slurmconf_default():
        env.append(f"SLURM_CONF={slurm_conf}")
    add_file(prefix / "jobwrap.env", "# the hooks' settings (jobwrap install; "
             "prolog/hook-env.sh reads them)\n" + "\n".join(env) + "\n", 0o644,
             "the hooks' settings")
    add_dir(config_path.parent, 0o755, "the config's folder")
    add_file(config_path, "# jobwrap configuration: every key with its default, all "
             "commented out (jobwrap install)\n# jobwrap config validate checks it; "
             "jobwrap config show prints what is in effect\n"
             + config_mod.defaults_toml(commented=True), 0o644, "the config", absent=True)
    try:  # as written: each node's {node} is filled in below
        cfg = config_mod.parse(config_path.read_bytes(), str(config_path)) \
            if config_path.exists() else config_mod.Config()
    except OSError as exc:
        raise InstallError(f"cannot read {config_path}: {exc.strerror or exc}") from None
    nodes = [host]
    edits: list[slurmconf.Edit] = []
    edited: Path | None = None  # slurm.conf's own file, when it is merged
    if slurm_conf is not None and slurm_conf.exists():
        _, found = slurmconf.host_nodes(slurm_conf, host)
        nodes = found or nodes
        edited, edits = _plan_slurm_conf(slurm_conf, prefix, cfg, add_file, notes)
    elif slurm_conf is not None:
        notes.append(f"{slurm_conf}: none here (a configless node?): slurm.conf's lines are "
                     "merged where it lives, by `jobwrap install` on the controller")
    for node in nodes:
        local = config_mod.for_node(cfg, node, env={})
        if "compute" in roles:
            add_dir(Path(local.paths.state_dir), 0o755, "the node's state", kind="data")
            add_dir(Path(local.paths.scratch_root), 0o755, "the jobs' scratch", kind="data")
            add_dir(Path(local.paths.cache_root), 0o700, "the staging cache", kind="data")
        if local.log.file:
            add_dir(Path(local.log.file).parent, 0o750, "jobwrap's log", kind="data")
    if "compute" in roles or "controller" in roles:
        add_dir(Path(cfg.paths.archive_root), 0o711, "the archive, on shared storage",
                kind="archive")
    enable: list[str] = []
    record = read_record(prefix)
    enabled_before = set(record.get("units", [])) if record else set()
    units = [u for role in roles for u in _UNITS[role]]
    if units:
        add_dir(systemd_dir, 0o755, "systemd's units")
    shipped_units = _shipped("systemd")
    for name, enabled in units:
        add_file(systemd_dir / name, _unit_text(shipped_units[name], prefix, program,
                                                config_path), 0o644, f"the {name} unit")
        if enabled and name not in enabled_before:
            enable.append(name)
    return Plan(roles, prefix, program, files, dirs, enable, edited, edits, notes)


def slurmconf_default() -> str:
    from wrapper.slurm.conf import DEFAULT_SLURM_CONF

    return DEFAULT_SLURM_CONF


def _plan_slurm_conf(path: Path, prefix: Path, cfg: Any, add_file: Callable[..., None],
                     notes: list[str]) -> tuple[Path, list[slurmconf.Edit]]:
    """slurm.conf's lines and job_submit.lua: the file edited where it lives (through a
    link), Includes and job_submit.lua where Slurm looks, beside the path it is given."""
    from wrapper.submit import lua

    real = Path(os.path.realpath(path))
    merged = slurmconf.merge(real, slurmconf.wants(str(prefix)), folder=path.parent)
    notes.extend(merged.notes)
    mode = stat.S_IMODE(real.stat().st_mode)
    add_file(real, merged.text, mode, "slurm.conf's lines")
    for hook, verb in merged.hooks:
        if not Path(hook).parent.is_dir():
            raise InstallError(f"{path}: its {verb.capitalize()} names the folder "
                               f"{Path(hook).parent}, which does not exist: make it (mkdir "
                               f"-m 0755) or set {verb.capitalize()} to a program")
        folder = "epilog" if verb == "epilog" else "prolog"
        add_file(Path(hook), f"#!/bin/sh\n# jobwrap's {verb}, in the site's folder of hooks "
                 f"(jobwrap install)\nexec {prefix}/{folder}/{verb}\n", 0o755,
                 f"the {verb} hook in the site's folder")
    plugin = path.parent / lua.PLUGIN_NAME
    existing = _read(plugin)
    if existing is not None and lua.SITE_BEGIN not in existing:
        raise InstallError(f"{plugin} is the site's own job_submit.lua, not jobwrap's: "
                           "merge jobwrap's checks into it by hand (`jobwrap install-lua -` "
                           "prints them), or move it away and run `jobwrap install` again")
    site = lua.SiteDefaults.from_config(cfg)
    add_file(plugin, lua.render(site, cfg.source), 0o644, "job_submit.lua")
    return real, merged.edits


def _unit_text(text: str, prefix: Path, program: Path, config_path: Path) -> str:
    text = text.replace("/opt/jobwrap/venv/bin/jobwrap", str(program))
    text = text.replace("/opt/jobwrap/", f"{prefix}/")
    if str(config_path) != "/etc/jobwrap/config.toml":
        text = text.replace("[Service]\n", f"[Service]\nEnvironment=JOBWRAP_CONFIG="
                            f"{config_path}\n", 1)
    return text


# -- showing and applying ------------------------------------------------------------------
def diff(plan_: Plan) -> str:
    """Every change as a unified diff, and the folders to be made."""
    out: list[str] = []
    for d in plan_.dirs:
        if not d.exists:
            out.append(f"mkdir -m {d.mode:04o} {d.path}    # {d.what}\n")
    for f in plan_.files:
        if not f.changes:
            continue
        before = (f.before or "").splitlines(keepends=True)
        label = "/dev/null" if f.before is None else str(f.path)
        out.extend(difflib.unified_diff(before, f.text.splitlines(keepends=True),
                                        fromfile=label, tofile=str(f.path)))
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n"
    for unit in plan_.enable if systemd_runs() else []:
        out.append(f"systemctl enable --now {unit}\n")
    return "".join(out)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def record_path(prefix: Path) -> Path:
    return prefix / RECORD_NAME


def read_record(prefix: Path) -> dict[str, Any] | None:
    text = _read(record_path(prefix))
    if text is None:
        return None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InstallError(f"{record_path(prefix)}: not jobwrap's install record ({exc})"
                           ) from None
    if not isinstance(record, dict) or record.get("format", 0) > RECORD_FORMAT:
        raise InstallError(f"{record_path(prefix)}: written by a newer jobwrap (format "
                           f"{record.get('format') if isinstance(record, dict) else '?'}); "
                           "uninstall with that version")
    return record


def systemd_runs() -> bool:
    return Path("/run/systemd/system").is_dir() and shutil.which("systemctl") is not None


def apply(plan_: Plan, *, run: Callable[[list[str]], None] | None = None) -> list[str]:
    """Make the changes, and keep (or extend) the record; returns what was done.

    The record is written before each file is: whatever stops the install part-way (a
    full disk, a read-only /etc), ``jobwrap uninstall`` takes out what was done."""
    done: list[str] = []
    record = read_record(plan_.prefix) or {
        "format": RECORD_FORMAT, "files": [], "dirs": [], "units": [], "edits": [],
        "slurm_conf": ""}
    roles = sorted(set(record.get("roles", [])) | set(plan_.roles), key=ROLES.index)
    record.update(version=__version__, program=str(plan_.program), roles=roles)
    if plan_.changes or "when" not in record:
        record["when"] = time.time()
    if plan_.slurm_conf is not None:
        record["slurm_conf"] = str(plan_.slurm_conf)
        record["edits"] += [e.as_dict() for e in plan_.edits
                            if e.as_dict() not in record["edits"]]
    where = record_path(plan_.prefix)

    def keep() -> None:
        atomic_write(where, (json.dumps(record, indent=1) + "\n").encode(), mode=0o600)

    try:
        for d in plan_.dirs:
            if d.exists:
                continue
            for path in reversed([p for p in [d.path, *d.path.parents] if not p.exists()]):
                path.mkdir(mode=0o755)
                record["dirs"].append({"path": str(path),
                                       "kind": d.kind if path == d.path else ""})
                if plan_.prefix.is_dir():
                    keep()
            os.chmod(d.path, d.mode)
            done.append(f"made {d.path} ({d.what})")
        for f in plan_.files:
            if not f.changes:
                continue
            entry = next((e for e in record["files"] if e["path"] == str(f.path)), None)
            if entry is None:
                record["files"].append({"path": str(f.path), "before": f.before,
                                        "after": _sha(f.text), "what": f.what})
            else:
                entry["after"] = _sha(f.text)  # what was there before jobwrap stays
            keep()
            _check_ancestors(f.path.parent)  # as at the plan: nobody swapped a folder since
            uid, gid = _owner(f.path)
            atomic_write(f.path, f.text.encode(), mode=f.mode, uid=uid, gid=gid)
            done.append(f"wrote {f.path} ({f.what})")
        if done or not where.exists():
            keep()
    except OSError as exc:
        raise InstallError(f"cannot write {getattr(exc, 'filename', '') or 'a file'}: "
                           f"{exc.strerror or exc}; what was done so far is in {where}, "
                           "and `jobwrap uninstall` takes it out") from None
    if plan_.enable and systemd_runs() and run is not None:
        for argv in (["systemctl", "daemon-reload"],
                     *(["systemctl", "enable", "--now", u] for u in plan_.enable
                       if u not in record["units"])):
            try:
                run(argv)
            except Exception as exc:  # the units are in place: enabling is the admin's now
                plan_.notes.append(f"{' '.join(argv)} failed ({exc}); run it by hand")
                continue
            if argv[2:3] == ["--now"]:
                record["units"].append(argv[-1])
                done.append(f"enabled {argv[-1]}")
        keep()
    elif plan_.enable:
        plan_.notes.append("systemd does not run here: enable " + ", ".join(plan_.enable)
                           + " where it does (or use the cron line in docs/systemd.md)")
    return done


def _owner(path: Path) -> tuple[int, int]:
    """Who owns what a file replaces (a site's slurm.conf may be SlurmUser's); root for
    a new file (when root installs)."""
    try:
        info = os.lstat(path)
        return info.st_uid, info.st_gid
    except FileNotFoundError:
        return (0, 0) if os.geteuid() == 0 else (-1, -1)


# -- uninstall -----------------------------------------------------------------------------
@dataclass
class Undone:
    done: list[str]
    kept: list[str]  # what uninstall left, and why


def uninstall(prefix: Path, *, purge: bool = False, dry_run: bool = False,
              run: Callable[[list[str]], None] | None = None) -> Undone:
    """Put back what the record says install changed; folders of data stay unless
    ``purge`` (the archive always: it is shared and holds every job's record)."""
    record = read_record(prefix)
    if record is None:
        raise InstallError(f"no install record at {record_path(prefix)}: nothing installed "
                           "there by `jobwrap install` (pass the --prefix it was given)")
    done: list[str] = []
    kept: list[str] = []
    if record.get("units") and systemd_runs() and run is not None and not dry_run:
        for unit in record["units"]:
            try:
                run(["systemctl", "disable", "--now", unit])
                done.append(f"disabled {unit}")
            except Exception as exc:  # a unit file gone already: the rest still comes out
                kept.append(f"{unit}: systemctl disable failed ({exc})")
    slurm_conf = record.get("slurm_conf") or ""
    for entry in reversed(record["files"]):
        path = Path(entry["path"])
        try:
            _undo_file(path, entry, record, slurm_conf, dry_run, done, kept)
        except (InstallError, OSError) as exc:
            kept.append(f"{path}: {exc.strerror if isinstance(exc, OSError) else exc}; "
                        "left as it is")
    if not dry_run:
        record_path(prefix).unlink(missing_ok=True)
    for entry in reversed(record["dirs"]):
        path, kind = Path(entry["path"]), entry.get("kind", "")
        if kind == "archive":
            kept.append(f"{path}: the archive, kept (shared, every job's record: remove it "
                        "by hand if you mean to)")
            continue
        if kind == "data" and not purge:
            kept.append(f"{path}: jobs' data, kept (--purge removes it)")
            continue
        if dry_run:
            done.append(f"would remove {path}" + ("" if kind else " (when empty)"))
            continue
        if kind == "data":
            left = _purge(path)
            (kept if left else done).append(f"{path}: {left}" if left else f"removed {path}")
            continue
        try:
            path.rmdir()
            done.append(f"removed {path}")
        except FileNotFoundError:
            continue
        except OSError:
            kept.append(f"{path}: not empty (holds what jobwrap did not put there); kept")
    return Undone(done, kept)


def _undo_file(path: Path, entry: dict[str, Any], record: dict[str, Any], slurm_conf: str,
               dry_run: bool, done: list[str], kept: list[str]) -> None:
    """One recorded file put back: slurm.conf always by taking jobwrap's lines out (an
    earlier text would undo the site's edits since), jobwrap's own files by their text
    before, when nobody changed them since."""
    now = _read(path)
    before = entry["before"]
    if now is None:
        kept.append(f"{path}: already gone")
        return
    if entry["path"] == slurm_conf:
        text, notes = slurmconf.unmerge(path, now, [slurmconf.Edit(**e)
                                                    for e in record["edits"]])
        kept.extend(notes)
        if not dry_run:
            uid, gid = _owner(path)
            atomic_write(path, text.encode(), mode=stat.S_IMODE(path.stat().st_mode),
                         uid=uid, gid=gid)
        done.append(f"took jobwrap's lines out of {path}")
        return
    if _sha(now) != entry["after"]:
        if before is None and entry.get("what") == "the config":
            kept.append(f"{path}: the site's config now (edited since install); kept")
        else:
            kept.append(f"{path}: changed since install; left as it is")
        return
    if not dry_run:
        if before is None:
            path.unlink()
        else:
            uid, gid = _owner(path)
            atomic_write(path, before.encode(), mode=stat.S_IMODE(path.stat().st_mode),
                         uid=uid, gid=gid)
    done.append(f"{'removed' if before is None else 'restored'} {path}")


def _purge(path: Path) -> str:
    """A folder of jobs' data removed without following a link or crossing a mount;
    what was left, "" when none."""
    from wrapper.osl.dirs import remove_tree

    try:
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        return f"not removed ({exc.strerror})"
    try:
        removal = remove_tree(parent, path.name, display=str(path))
    finally:
        os.close(parent)
    return f"kept what is mounted there: {', '.join(removal.left)}" if removal.left else ""
