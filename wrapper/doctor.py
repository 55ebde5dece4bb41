"""``jobwrap doctor``: checks one node's install of jobwrap and says how to fix each fault.

It reads slurm.conf itself (``--slurm-conf``, else ``$SLURM_CONF``, else
``/etc/slurm/slurm.conf``; ``Include`` lines followed), because the faults it looks for
(a hook missing, a flag not set) are exactly the ones that make Slurm's own view of the
node misleading. Exit status: 0 when nothing failed (warnings allowed), 1 otherwise.
``--json`` prints ``{"ok", "summary", "checks": [{"check", "status", "detail", "fix"}],
"versions", "slurm_conf", "config"}``.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import re
import stat
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from wrapper import __version__
from wrapper.config import Config
from wrapper.errors import EXIT_OK, EXIT_UNHEALTHY, CommandError, CommandTimeout
from wrapper.fastdataclass import dataclass
from wrapper.runner import Runner
from wrapper.slurm.conf import DEFAULT_SLURM_CONF, SlurmConf, parse_slurm_conf

__all__ = ["DEFAULT_SLURM_CONF", "SlurmConf", "parse_slurm_conf"]

DEFAULT_HOOKS = "/opt/jobwrap"  # where the install guide puts prolog/, epilog/ and venv/
STATUSES = ("pass", "warn", "fail")


@dataclass(frozen=True)
class Finding:
    check: str
    status: str  # pass | warn | fail
    detail: str
    fix: str = ""


# -- the checks ----------------------------------------------------------------------------
def diagnose(*, config_path: str | None, slurm_conf: str | None = None, node: str = "",
             env: Mapping[str, str] | None = None, runner: Runner | None = None,
             owner_uid: int = 0) -> tuple[list[Finding], dict[str, str]]:
    """Every check, in the order printed, and the versions found.

    ``owner_uid``: who must own jobwrap's folders and the hooks (root on a real node).
    """
    environ = dict(os.environ if env is None else env)
    findings: list[Finding] = []
    cfg, finding = _check_config(config_path, environ, node)
    findings.append(finding)
    conf_path = Path(slurm_conf or environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF)
    try:
        conf: SlurmConf | None = parse_slurm_conf(conf_path)
    except OSError as exc:
        conf = None
        findings.append(Finding("slurm.conf", "fail", f"cannot read {conf_path}: "
                                f"{exc.strerror or exc}", "pass --slurm-conf PATH or set "
                                "SLURM_CONF to the cluster's slurm.conf"))
    if conf is not None and conf.missing:
        findings.append(Finding("slurm.conf", "fail", f"{'; '.join(conf.missing)}: no such "
                                "file (Slurm's daemons and commands refuse to start)",
                                "fix or remove the Include line"))
    elif conf is not None:
        findings.append(Finding("slurm.conf", "pass", f"{conf.path} ({len(conf.files)} "
                                f"file{'s' if len(conf.files) != 1 else ''})"))
    if conf is not None:
        findings.extend(_check_hooks(conf, cfg, environ, owner_uid))
        findings.extend(_check_slurm_settings(conf, cfg))
    for name in ("state_dir", "scratch_root", "cache_root", "archive_root"):
        findings.append(check_folder(f"folder.{name}", Path(getattr(cfg.paths, name)),
                                     owner_uid))
    findings.append(check_log(cfg, owner_uid))
    findings.append(check_placement(cfg))
    findings.append(_check_archive_access(cfg))
    findings.append(check_indexer(cfg))
    findings.append(check_index_database(cfg))
    findings.append(check_pulse(cfg, node or environ.get("SLURMD_NODENAME", "")))
    findings.append(_check_gpu(cfg, node))
    slurm_version = ""
    if conf is not None and conf.missing:
        # Slurm's commands would retry the missing include for a minute each.
        findings.append(Finding("slurm.commands", "fail", "not run: they cannot read "
                                f"{conf.path} (see slurm.conf above)", "fix slurm.conf first"))
    else:
        slurm_findings, slurm_version = _check_slurm_commands(cfg, runner, environ, conf)
        findings.extend(slurm_findings)
        if slurm_version:
            findings.append(check_prolog_every_attempt(slurm_version, cfg))
        if slurm_version and conf is not None:
            findings.append(check_requeue_mechanism(conf, slurm_version, cfg))
    versions = {"jobwrap": __version__, "slurm": slurm_version or "unknown",
                "python": platform.python_version()}
    findings.append(Finding("versions", "pass", ", ".join(f"{k} {v}"
                                                          for k, v in versions.items())))
    return findings, versions


def _check_config(config_path: str | None, env: Mapping[str, str], node: str = ""
                  ) -> tuple[Config, Finding]:
    from wrapper import config
    from wrapper.errors import ConfigError

    try:
        cfg = config.load(config_path, dict(env), node=node or None)
    except ConfigError as exc:
        return Config(), Finding("config", "fail", str(exc), "fix the keys listed (jobwrap "
                                 "config defaults shows every key); the checks below use "
                                 "the defaults")
    return cfg, Finding("config", "pass", f"{cfg.source} is valid")


_HOOKS = (("Prolog", "prolog", "prolog/prolog"), ("Epilog", "epilog", "epilog/epilog"),
          ("TaskProlog", "task-prolog", "prolog/task-prolog"))


def _runs_verb(text: str, verb: str) -> bool:
    # `jobwrap prolog`, or the shipped hooks' `exec "$JOBWRAP_BIN" prolog`.
    return re.search(rf"""(?:\bjobwrap|\$\{{?JOBWRAP_BIN\}}?)["']?\s+{re.escape(verb)}"""
                     r"""(?![\w-])""", text) is not None


def _find_hook(value: str, verb: str) -> Path | None:
    """The file among a hook parameter's (comma-separated, globs) that runs jobwrap, or
    that execs the hook that does (the one `jobwrap install` puts in a site's folder of
    prologs: ``exec /opt/jobwrap/prolog/prolog``)."""
    for item in value.split(","):
        for candidate in sorted(glob.glob(item.strip())) if item.strip() else []:
            for path in (candidate, _exec_target(candidate)):
                try:
                    text = Path(path).read_text(errors="replace")[:65536] if path else ""
                except OSError:
                    continue
                if _runs_verb(text, verb):
                    return Path(path)
    return None


def _exec_target(path: str) -> str:
    """The program a two-line shell hook hands over to (``exec /abs/path``), or ""."""
    try:
        text = Path(path).read_text(errors="replace")[:4096]
    except OSError:
        return ""
    found = re.search(r"^exec (/\S+)\s*$", text, re.M)
    return found.group(1) if found else ""


def _check_hooks(conf: SlurmConf, cfg: Config, env: Mapping[str, str],
                 owner_uid: int) -> list[Finding]:
    found = {key: hook for key, verb, _ in _HOOKS
             if (hook := _find_hook(conf.get(key) or "", verb)) is not None}
    out: list[Finding] = []
    for key, verb, _ in _HOOKS:
        value = conf.get(key)
        where = conf.values[key.lower()][1] if value else conf.path
        hook = found.get(key)
        if hook is not None:
            problem = _unsafe_file(hook, owner_uid)
            if problem:
                out.append(Finding(f"slurm.{key.lower()}", "fail", f"{key}={hook}: {problem[0]}",
                                   problem[1]))
            else:
                out.append(Finding(f"slurm.{key.lower()}", "pass", f"{key}={hook} runs "
                                   f"`jobwrap {verb}`"))
            continue
        seen = f"{key}={value} does not run `jobwrap {verb}` (missing, unreadable or " \
               "another program)" if value else f"no {key}= line"
        out.append(Finding(f"slurm.{key.lower()}", "fail", f"{seen} in {where}",
                           f"set {key}={_suggest_hook(found, key)} in {where} (the hook that "
                           f"runs `jobwrap {verb}`), then `scontrol reconfigure`"))
    if found:
        out.append(_check_hook_program(found, cfg, env))
    return out


def _suggest_hook(found: Mapping[str, Path], key: str) -> str:
    """Where the missing hook most likely is: beside the ones found, else the default."""
    relative = {k: rel for k, _, rel in _HOOKS}[key]
    for path in found.values():
        return str(path.parent.parent / relative)  # <install>/prolog/prolog -> <install>
    return f"{DEFAULT_HOOKS}/{relative}"


def _check_hook_program(found: Mapping[str, Path], cfg: Config,
                        env: Mapping[str, str]) -> Finding:
    """The shipped hooks find jobwrap through jobwrap.env or /etc/jobwrap/hooks.env (see
    prolog/hook-env.sh); one that finds nothing lets every job run unchecked."""
    hook = next(iter(found.values()))
    install = hook.parent.parent
    settings: dict[str, str] = {}
    source = ""
    for env_file in (install / "jobwrap.env", Path("/etc/jobwrap/hooks.env")):
        if env_file.is_file():
            settings, source = _read_env_file(env_file), str(env_file)
            break
    program = settings.get("JOBWRAP_BIN", "")
    if not program:
        for candidate in (install / "venv/bin/jobwrap", install / ".venv/bin/jobwrap",
                          Path("/opt/jobwrap/venv/bin/jobwrap"),
                          Path("/usr/local/bin/jobwrap"), Path("/usr/bin/jobwrap")):
            if os.access(candidate, os.X_OK):
                program = str(candidate)
                break
    if not program or not os.access(program, os.X_OK):
        return Finding("hooks.program", "fail", f"the hooks in {install} find no jobwrap "
                       f"program ({program or 'none set'}); they let every job run unchecked",
                       f"set JOBWRAP_BIN=/opt/jobwrap/venv/bin/jobwrap in {install}/jobwrap.env "
                       "or /etc/jobwrap/hooks.env")
    hooks_config = settings.get("JOBWRAP_CONFIG") or env.get("JOBWRAP_CONFIG") or ""
    if hooks_config and os.path.realpath(hooks_config) != os.path.realpath(cfg.source):
        return Finding("hooks.program", "warn", f"the hooks run {program} with "
                       f"JOBWRAP_CONFIG={hooks_config} (from {source or 'the environment'}), "
                       f"but this doctor read {cfg.source}",
                       f"run jobwrap --config {hooks_config} doctor")
    return Finding("hooks.program", "pass", f"the hooks run {program}"
                   + (f" (settings: {source})" if source else ""))


def _read_env_file(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text(errors="replace").splitlines():
        key, eq, value = line.strip().partition("=")
        if eq and not key.startswith("#"):
            out[key.strip()] = value.strip().strip("'\"")
    return out


def _check_slurm_settings(conf: SlurmConf, cfg: Config) -> list[Finding]:
    where = conf.path
    out = []
    flags = conf.items("PrologFlags")
    if "alloc" in flags or "contain" in flags:  # Contain implies Alloc
        out.append(Finding("slurm.prolog_flags", "pass", f"PrologFlags={conf.get('PrologFlags')}"))
    else:
        now = f"PrologFlags={conf.get('PrologFlags')}" if flags else "no PrologFlags"
        out.append(Finding("slurm.prolog_flags", "fail", f"{now}: the prolog runs only when a "
                           "job step starts, and on the nodes that run one",
                           f"add Alloc to PrologFlags in {where} (PrologFlags=Alloc)"))
    if "nohold_on_prolog_fail" in conf.items("SchedulerParameters"):
        out.append(Finding("slurm.nohold_on_prolog_fail", "pass",
                           "SchedulerParameters has nohold_on_prolog_fail"))
    else:
        out.append(Finding("slurm.nohold_on_prolog_fail", "fail", "SchedulerParameters lacks "
                           "nohold_on_prolog_fail: a job whose prolog fails on a bad node is "
                           "requeued held, and waits for an admin",
                           f"add nohold_on_prolog_fail to SchedulerParameters in {where}"))
    out.append(_check_requeue(conf))
    out.append(_check_timeout(conf, cfg))
    out.append(_check_job_submit(conf))
    return out


def _jobwraps_lua(conf: SlurmConf) -> Path | None:
    lua = conf.path.parent / "job_submit.lua"
    plugins = conf.items("JobSubmitPlugins")
    if not ({"lua", "job_submit/lua"} & set(plugins)):
        return None
    try:
        return lua if "BEGIN SITE" in lua.read_text(errors="replace") else None
    except OSError:
        return None


def _check_requeue(conf: SlurmConf) -> Finding:
    value = (conf.get("JobRequeue") or "").strip()
    if value in ("", "1"):
        return Finding("slurm.job_requeue", "pass", f"JobRequeue={value or '1 (default)'}")
    if value == "0" and _jobwraps_lua(conf) is not None:
        return Finding("slurm.job_requeue", "pass", "JobRequeue=0, but jobwrap's "
                       "job_submit.lua makes each batch job requeueable")
    return Finding("slurm.job_requeue", "fail", f"JobRequeue={value}: failed jobs cannot be "
                   "requeued, so jobwrap cannot restart them",
                   f"set JobRequeue=1 in {conf.path} (or install jobwrap's job_submit.lua)")


def check_prolog_every_attempt(version: str, cfg: Config) -> Finding:
    """Whether this Slurm runs the Prolog for every attempt of a requeued job: slurmd
    before 23.02 skips it for a job back on a node within seconds (its credential cache
    still holds the job id: Slurm bug 15656, fixed by 23.02's commit 420a659f98)."""
    numbers = re.match(r"(\d+)\.(\d+)", version)
    if numbers is None:
        return Finding("slurm.prolog_every_attempt", "warn", f"Slurm version {version!r} not "
                       "understood: whether it skips the Prolog of a requeued job is unknown",
                       "keep [hooks] unchecked_attempt = \"requeue\"")
    if (int(numbers[1]), int(numbers[2])) >= (23, 2):
        return Finding("slurm.prolog_every_attempt", "pass", f"Slurm {version} runs the "
                       "Prolog for every attempt of a requeued job")
    then = ("the task-prolog ends such an attempt before the job's code runs and it is "
            "requeued away from that node") if cfg.hooks.unchecked_attempt == "requeue" \
        else "such an attempt runs unchecked ([hooks] unchecked_attempt = \"run\")"
    return Finding("slurm.prolog_every_attempt", "warn", f"Slurm {version} skips the Prolog "
                   "of a job requeued back onto a node within seconds when another job "
                   f"launches steps there (bug 15656, fixed in 23.02): {then}",
                   "upgrade Slurm to 23.02 or later; until then keep [hooks] "
                   "unchecked_attempt = \"requeue\"")


def check_requeue_mechanism(conf: SlurmConf, version: str, cfg: Config) -> Finding:
    """What makes a requeued job eligible again on this cluster, and why: Slurm alone
    holds it for ``requeue_delay`` (25.11; before, and by default, ``cred_expire`` + 1 =
    121 s); jobwrap's release lifts that as soon as the job is pending."""
    delay = next((item.split("=", 1)[1] for item in conf.items("SchedulerParameters")
                  if item.startswith("requeue_delay=")), None)
    try:
        seconds = float(delay) if delay is not None else None
    except ValueError:
        seconds = None
    if seconds is not None and seconds <= cfg.restart.release_delay:
        return Finding("slurm.requeue", "pass", f"Slurm's own: SchedulerParameters="
                       f"requeue_delay={delay} makes a requeued job eligible at once; "
                       "jobwrap's release finds it started, or only excludes faulty nodes")
    held = f"requeue_delay={delay} s" if delay is not None else "cred_expire + 1 = 121 s"
    numbers = re.match(r"(\d+)\.(\d+)", version)
    newer = numbers is not None and (int(numbers[1]), int(numbers[2])) >= (25, 11)
    hint = ("; this Slurm can do it itself: SchedulerParameters=requeue_delay=0" if newer
            else "")
    return Finding("slurm.requeue", "pass", f"jobwrap's release: Slurm {version} alone "
                   f"holds a requeued job for {held}; jobwrap makes it eligible "
                   f"{cfg.restart.release_delay:g} s after it is pending{hint}")


def _check_timeout(conf: SlurmConf, cfg: Config) -> Finding:
    budget = max(cfg.hooks.prolog_budget, cfg.hooks.epilog_budget)
    value = conf.get("PrologEpilogTimeout")
    if value is None or value.strip().upper() in ("", "UNLIMITED", "INFINITE", "65534"):
        return Finding("slurm.prolog_epilog_timeout", "pass", "PrologEpilogTimeout unset: "
                       f"Slurm waits for the hooks; jobwrap's budgets end them ({budget:g} s)")
    if not value.strip().isdigit():
        return Finding("slurm.prolog_epilog_timeout", "fail", f"PrologEpilogTimeout={value} "
                       "is not a number of seconds", f"fix it in {conf.path}")
    timeout = int(value)
    fix = (f"set PrologEpilogTimeout={int(budget * 1.1) + 10} or more in {conf.path}, or "
           "lower [hooks] prolog_budget / epilog_budget")
    if timeout < budget:
        return Finding("slurm.prolog_epilog_timeout", "fail", f"PrologEpilogTimeout={timeout} "
                       f"s is shorter than jobwrap's hook budget ({budget:g} s): Slurm kills a "
                       "hook that is still within its budget", fix)
    if timeout < budget * 1.1 + 5:
        return Finding("slurm.prolog_epilog_timeout", "warn", f"PrologEpilogTimeout={timeout} "
                       f"s leaves little margin over jobwrap's hook budget ({budget:g} s)", fix)
    return Finding("slurm.prolog_epilog_timeout", "pass", f"PrologEpilogTimeout={timeout} s "
                   f"covers jobwrap's hook budget ({budget:g} s)")


def _check_job_submit(conf: SlurmConf) -> Finding:
    fix = (f"add JobSubmitPlugins=lua to {conf.path}, run `jobwrap install-lua "
           f"{conf.path.parent}`, then restart slurmctld")
    if not ({"lua", "job_submit/lua"} & set(conf.items("JobSubmitPlugins"))):
        return Finding("slurm.job_submit_lua", "warn", "JobSubmitPlugins has no lua: bad "
                       "#JOBWRAP directives are found only when the job starts", fix)
    lua = conf.path.parent / "job_submit.lua"
    if not lua.is_file():
        return Finding("slurm.job_submit_lua", "warn", f"JobSubmitPlugins=lua but {lua} does "
                       "not exist", fix)
    if _jobwraps_lua(conf) is None:
        return Finding("slurm.job_submit_lua", "warn", f"{lua} is not jobwrap's", fix)
    return Finding("slurm.job_submit_lua", "pass", f"{lua} is jobwrap's")


def _unsafe_file(path: Path, owner_uid: int) -> tuple[str, str] | None:
    """Why a file root runs or trusts is unsafe, and the fix; None when it is not."""
    try:
        info = path.stat()
    except OSError as exc:
        return f"cannot stat it: {exc.strerror}", f"check {path}"
    if not os.access(path, os.X_OK) or not info.st_mode & 0o111:
        return "is not executable", f"chmod 0755 {path}"
    if info.st_uid != owner_uid:
        return (f"is owned by uid {info.st_uid}, not {owner_uid}: that user can run "
                "anything as root", f"chown root:root {path}")
    if info.st_mode & 0o022:
        return (f"is writable by others (mode {stat.S_IMODE(info.st_mode):04o}): they can run "
                "anything as root", f"chmod go-w {path}")
    return _unsafe_ancestor(path)


def _unsafe_ancestor(path: Path) -> tuple[str, str] | None:
    for parent in path.resolve().parents:
        try:
            mode = parent.stat().st_mode
        except OSError:
            continue
        if mode & 0o002 and not mode & stat.S_ISVTX:
            return (f"its folder {parent} is world-writable (without the sticky bit): anyone "
                    "can replace what is in it", f"chmod o-w {parent}")
    return None


def check_folder(name: str, path: Path, owner_uid: int = 0, mode: int = 0o755) -> Finding:
    """One of jobwrap's folders: a real directory, owned by ``owner_uid``, writable by its
    owner, and writable by nobody else (``mode``: what the fix makes it)."""
    make = f"mkdir -p {path} && chown root:root {path} && chmod {mode:04o} {path}"
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return Finding(name, "fail", f"{path} does not exist", make)
    except OSError as exc:
        return Finding(name, "fail", f"cannot stat {path}: {exc.strerror}", make)
    mode = stat.S_IMODE(info.st_mode)
    if not stat.S_ISDIR(info.st_mode):
        kind = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a directory"
        return Finding(name, "fail", f"{path} is {kind}", f"rm {path} && {make}")
    if info.st_uid != owner_uid:
        return Finding(name, "fail", f"{path} is owned by uid {info.st_uid}, not {owner_uid}: "
                       "that user can tamper with what root's hooks keep there",
                       f"chown root:root {path}")
    if mode & 0o002:
        return Finding(name, "fail", f"{path} is world-writable (mode {mode:04o})",
                       f"chmod o-w {path}")
    if not mode & 0o200 or not os.access(path, os.W_OK):
        return Finding(name, "fail", f"{path} is not writable (mode {mode:04o}"
                       f"{', read-only file system' if mode & 0o200 else ''})",
                       f"chmod u+w {path}")
    ancestor = _unsafe_ancestor(path)
    if ancestor:
        return Finding(name, "fail", f"{path}: {ancestor[0]}", ancestor[1])
    if mode & 0o020 and info.st_gid != 0:
        return Finding(name, "warn", f"{path} is writable by group {info.st_gid} "
                       f"(mode {mode:04o})", f"chmod g-w {path}")
    return Finding(name, "pass", f"{path} (mode {mode:04o}, uid {info.st_uid})")


def check_log(cfg: Config, owner_uid: int = 0) -> Finding:
    """``[log] file``: where root's hooks, their release and the node watcher log (slurmd
    keeps no hook's stderr). Its folder must be a real directory of root's that no one
    else can write, or root logs to syslog instead (wrapper.log.open_log_file); a missing
    one is made by the first hook that runs as root, when its own folder is root's."""
    from wrapper.log import LOG_FOLDER_MODE

    name = "log.folder"
    if not cfg.log.file:
        return Finding(name, "warn", "[log] file is empty: root's hooks log only to their "
                       "stderr, which slurmd does not keep",
                       'set [log] file = "/var/log/jobwrap/jobwrap.log"')
    path = Path(os.path.abspath(cfg.log.file))
    folder = path.parent
    make = (f"mkdir -p {folder} && chown root:root {folder} && "
            f"chmod {LOG_FOLDER_MODE:04o} {folder}")
    if not os.path.lexists(folder):
        parent = check_folder(name, folder.parent, owner_uid)
        if parent.status == "fail":
            return Finding(name, "fail", f"{folder} does not exist, and the hooks cannot make "
                           f"it: {parent.detail}", make)
        return Finding(name, "warn", f"{folder} does not exist yet: the first hook that runs "
                       f"as root makes it (mode {LOG_FOLDER_MODE:04o}); until then nothing "
                       f"is logged to {path}", make)
    finding = check_folder(name, folder, owner_uid, LOG_FOLDER_MODE)
    if finding.status == "fail":
        return Finding(name, "fail", finding.detail + ": root's hooks log to syslog instead "
                       f"of {path}", finding.fix)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return Finding(name, finding.status, f"{finding.detail}; {path} is made by the first "
                       "hook", finding.fix)
    except OSError as exc:
        return Finding(name, "fail", f"cannot stat {path}: {exc.strerror}",
                       f"ls -l {path}")
    if not stat.S_ISREG(info.st_mode):
        kind = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a regular file"
        return Finding(name, "fail", f"{path} is {kind}: root's hooks log to syslog instead",
                       f"rm {path}")
    if info.st_uid != owner_uid:
        return Finding(name, "fail", f"{path} is owned by uid {info.st_uid}, not {owner_uid}",
                       f"chown root:root {path}")
    if info.st_mode & 0o002:
        return Finding(name, "fail", f"{path} is world-writable "
                       f"(mode {stat.S_IMODE(info.st_mode):04o})", f"chmod o-w {path}")
    if finding.status != "pass":
        return finding
    return Finding(name, "pass", f"{path} in {finding.detail}")


# File systems whose folders every node of a cluster sees (a mount's type, as
# /proc/self/mounts names it); fuse.* mounts are taken as shared too (sshfs, s3fs, ...).
SHARED_FS = ("nfs", "nfs4", "lustre", "gpfs", "cephfs", "ceph", "beegfs", "cifs", "smb3",
             "glusterfs", "wekafs", "pvfs2", "orangefs", "9p", "afs", "virtiofs")


def mount_type(path: str, mounts_text: str) -> str:
    """The type of the file system ``path`` lies on: the longest mount point above it."""
    best, kind = "", ""
    real = os.path.realpath(path)
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def is_shared(kind: str) -> bool:
    return kind in SHARED_FS or kind.startswith("fuse.")


def check_placement(cfg: Config, mounts_text: str | None = None) -> Finding:
    """Node-local state on a node's own disk, the archive where every node reads it: a
    requeued job's next nodes carry root's verdicts from the archive (archive/carry.py),
    and login nodes' ``jobwrap status`` reads it there."""
    if mounts_text is None:
        try:
            mounts_text = Path("/proc/self/mounts").read_text()
        except OSError as exc:
            return Finding("folder.placement", "warn", f"cannot read the mounts: {exc}")
    state = mount_type(cfg.paths.state_dir, mounts_text)
    if is_shared(state):
        return Finding("folder.placement", "fail",
                       f"state_dir {cfg.paths.state_dir} is on shared storage ({state}): "
                       "it is each node's own (its jobs' root records), and nodes must "
                       "not read each other's",
                       "set [paths] state_dir to a folder on the node's own disk")
    if not cfg.archive.enabled:
        return Finding("folder.placement", "warn",
                       "the archive is off: a requeued job's next nodes start without "
                       "root's verdicts on its earlier attempts (the brakes' history)",
                       "set [archive] enabled = true with archive_root on shared storage")
    archive = mount_type(cfg.paths.archive_root, mounts_text)
    if not is_shared(archive):
        return Finding("folder.placement", "warn",
                       f"archive_root {cfg.paths.archive_root} is on this node's own file "
                       f"system ({archive or 'unknown'}): a requeued job's next nodes and "
                       "login nodes read it from elsewhere (right only where every node "
                       "is this host, as in a test bed)",
                       "set [paths] archive_root to a folder on shared storage (NFS, "
                       "Lustre, GPFS, ...), the same on every node")
    return Finding("folder.placement", "pass", f"state_dir on {state or 'a local disk'}, "
                   f"archive_root on shared {archive}")


def check_pulse(cfg: Config, node: str = "") -> Finding:
    """The pulse can run on this node: munged answers (a credential made and read back),
    and the hub's address resolves where this node is a job's first node."""
    import socket

    from wrapper.pulse import munge

    if not cfg.pulse.enabled:
        return Finding("pulse", "pass", "off ([pulse] enabled = false): a lost node is "
                       "known after Slurm's SlurmdTimeout")
    if not cfg.supervisor.node_watch:
        return Finding("pulse", "warn", "[pulse] is on but [supervisor] node_watch is off: "
                       "the watchers that beat are not started",
                       "set [supervisor] node_watch = true, or [pulse] enabled = false")
    try:
        said = munge.decode(munge.encode(b"jobwrap doctor"))
    except munge.MungeError as exc:
        return Finding("pulse", "fail", f"{exc}: the job's watchers cannot prove they are "
                       "root to each other, so no job here has a pulse",
                       "start munged (systemctl start munge), as Slurm needs it too")
    from wrapper.config import this_node

    host = cfg.pulse.address.replace("{node}", node or this_node())
    try:
        address = socket.gethostbyname(host)
    except OSError as exc:
        return Finding("pulse", "fail", f"[pulse] address {cfg.pulse.address!r} is {host!r} "
                       f"here, which does not resolve ({exc}): a job whose first node this "
                       "is runs without a pulse",
                       "make the node's name resolve, or set [pulse] address")
    return Finding("pulse", "pass", f"munged answers (uid {said.uid}); a job's hub here "
                   f"listens on {address}, ports {cfg.pulse.ports} (open them between "
                   "compute nodes)")


INDEXER_LATE_S = 30 * 60.0  # a spool record this old: the indexer's timer is not running


def check_indexer(cfg: Config, now: float | None = None) -> Finding:
    """The archive's indexer: its last run and what waits in the spool (where this
    process may read the index: root)."""
    import time

    from wrapper.archive import index as index_mod
    from wrapper.goodput.view import span as age

    root = cfg.paths.archive_root
    if not cfg.archive.enabled or not os.path.isdir(root) or not index_mod.may_read(root):
        return Finding("archive.indexer", "pass", "not checked here: no archive this "
                       "process keeps the index of")
    now = time.time() if now is None else now
    found = index_mod.backlog(root, now)
    ran = found.last_run.get("ran_at") if found.last_run else None
    last = f"last run {age(now - ran)} ago" if isinstance(ran, int | float) else \
        "never run by `jobwrap archive index`"
    waiting = f"{found.records}{'+' if found.records >= index_mod.BACKLOG_MAX else ''} " \
              f"record{'s' if found.records != 1 else ''} in the spool" + \
              (f", the oldest {age(found.oldest_s)} old" if found.oldest_s is not None else "")
    if found.oldest_s is not None and found.oldest_s > INDEXER_LATE_S:
        return Finding("archive.indexer", "warn", f"{last}; {waiting}",
                       "enable the indexer where the index is kept: systemctl enable --now "
                       "jobwrap-indexer.timer (systemd/, docs/systemd.md), or its cron line")
    return Finding("archive.indexer", "pass", f"{last}; {waiting}")


def check_index_database(cfg: Config) -> Finding:
    """With ``[archive] index_backend = "mariadb"``: the connection file is root's alone and
    the database answers (what the indexer and root's commands need)."""
    if cfg.archive.index_backend != "mariadb":
        return Finding("archive.index", "pass", "sqlite, on this host")
    from wrapper.archive.index import IndexFault
    from wrapper.archive.index_mariadb import MariaDbIndex, cluster_name

    index = MariaDbIndex(cfg.paths.archive_root, cfg.archive.index_connection,
                         cluster_name(cfg.archive.cluster))
    try:
        index.check()
    except IndexFault as exc:
        if "there is no index" in str(exc):
            return Finding("archive.index", "pass", f"{index.path}: reachable; built by the "
                           "first `jobwrap archive index`")
        return Finding("archive.index", "fail", str(exc), "fix [archive] index_connection "
                       "(docs/scale.md: a server database); until then the commands read the "
                       "manifests")
    except Exception as exc:  # a newer layout, or anything the driver raises
        return Finding("archive.index", "warn", f"{index.path}: {exc}",
                       "run the newest jobwrap's `jobwrap archive index`")
    finally:
        index.close()
    return Finding("archive.index", "pass", f"{index.path}: reachable, this cluster indexed")


def _check_archive_access(cfg: Config) -> Finding:
    from wrapper.archive import access

    status, detail, fix = access.check(cfg)
    return Finding("archive.access", status, detail, fix)


def _check_gpu(cfg: Config, node: str) -> Finding:
    backend = cfg.gpu.backend
    fix = ("install the NVIDIA driver and nvidia-ml-py (pynvml), or on a node without GPUs "
           "set [gpu] backend = \"fake\" with a fake_inventory"
           if backend == "nvml" else "fix [gpu] fake_inventory (its format: wrapper/gpu/fake.py)")
    try:
        from wrapper.gpu import backend as probe_module
    except ImportError as exc:
        return Finding("gpu.probe", "fail", f"jobwrap's GPU module cannot be imported: {exc}",
                       "reinstall jobwrap")

    def read() -> str:
        probe = probe_module.open_probe(cfg.gpu, node)
        try:
            count = len(probe.devices(()))
            return f"{backend}: {count} GPU(s), driver {probe.driver_version()}"
        finally:
            probe.close()

    outcome = _with_timeout(read, cfg.checks.probe_budget)
    if isinstance(outcome, str):
        return Finding("gpu.probe", "pass", outcome)
    if isinstance(outcome, TimeoutError):
        return Finding("gpu.probe", "fail", f"{backend}: no answer within "
                       f"{cfg.checks.probe_budget:g} s ([checks] probe_budget): NVML hangs",
                       "check the driver (nvidia-smi), persistence mode and dmesg for Xids")
    return Finding("gpu.probe", "fail", f"{backend}: {outcome}", fix)


def _with_timeout(fn: Callable[[], str], timeout: float) -> str | BaseException:
    """fn() in a daemon thread: a hung NVML must not hang the doctor."""
    box: list[str | BaseException] = []

    def run() -> None:
        try:
            box.append(fn())
        except Exception as exc:  # any failure of the probe is the finding
            box.append(exc)

    thread = threading.Thread(target=run, name="doctor-gpu-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return box[0] if box else TimeoutError()


def _check_slurm_commands(cfg: Config, runner: Runner | None, env: Mapping[str, str],
                          conf: SlurmConf | None) -> tuple[list[Finding], str]:
    run_env = dict(env)
    if conf is not None:
        run_env["SLURM_CONF"] = str(conf.path)  # the commands must talk to this cluster
    runner = runner or Runner(run_env)
    out: list[Finding] = []
    version = ""
    for key in ("scontrol_command", "sinfo_command", "squeue_command", "scancel_command"):
        command = getattr(cfg.slurm, key)
        try:
            result = runner.run([command, "--version"], timeout=cfg.slurm.command_timeout)
        except CommandError as exc:
            if isinstance(exc, CommandTimeout):
                fix = "check that slurm.conf's includes and SlurmctldHost answer"
            elif "failed with exit code" in exc.reason:  # it runs, but cannot read its config
                fix = f"check that Slurm reads {run_env.get('SLURM_CONF', DEFAULT_SLURM_CONF)}"
            else:
                fix = f"install Slurm's client commands, or set [slurm] {key}"
            out.append(Finding(f"slurm.{key.removesuffix('_command')}", "fail", str(exc), fix))
            continue
        text = result.stdout.strip()
        if key == "scontrol_command":
            version = text.split()[-1] if text else ""
        out.append(Finding(f"slurm.{key.removesuffix('_command')}", "pass",
                           f"{command}: {text or 'answers'}"))
    return out, version


# -- output --------------------------------------------------------------------------------
def summary(findings: list[Finding]) -> dict[str, int]:
    return {status: sum(f.status == status for f in findings) for status in STATUSES}


def render_table(findings: list[Finding]) -> str:
    counts = summary(findings)
    head = (f"jobwrap doctor: {counts['pass']} passed, {counts['warn']} warning"
            f"{'s' if counts['warn'] != 1 else ''}, {counts['fail']} failed")
    width = max((len(f.check) for f in findings), default=0)
    pad = " " * (6 + width + 2)
    lines = [head]
    for f in findings:
        detail = f.detail.splitlines() or [""]
        lines.append(f"{f.status.upper():<6}{f.check:<{width}}  {detail[0]}")
        lines.extend(pad + more for more in detail[1:])
        if f.fix and f.status != "pass":
            lines.append(f"{pad}fix: {f.fix}")
    return "\n".join(lines)


def as_json(findings: list[Finding], versions: Mapping[str, str], *, slurm_conf: str,
            config: str) -> dict[str, Any]:
    counts = summary(findings)
    return {"ok": counts["fail"] == 0, "summary": counts,
            "checks": [asdict(f) for f in findings], "versions": dict(versions),
            "slurm_conf": slurm_conf, "config": config}


@click.command("doctor")
@click.option("--slurm-conf", metavar="PATH",
              help=f"The cluster's slurm.conf [default: $SLURM_CONF, else {DEFAULT_SLURM_CONF}].")
@click.option("--node", metavar="NAME", help="Slurm node name, for a fake GPU inventory's "
              "{node} [default: $SLURMD_NODENAME, else the short hostname].")
@click.option("--json", "as_json_flag", is_flag=True, help="Print the findings as JSON.")
def doctor(slurm_conf: str | None, node: str | None, as_json_flag: bool) -> None:
    """Check this node's jobwrap install: slurm.conf, config, folders, GPUs, Slurm.

    Exit status 0 when no check failed (warnings allowed), 1 otherwise.
    """
    import socket

    from wrapper import config as config_mod

    root = click.get_current_context().find_root().obj or {}
    config_path = root.get("config_path")
    name = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    findings, versions = diagnose(config_path=config_path, slurm_conf=slurm_conf, node=name)
    conf_path = slurm_conf or os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF
    if as_json_flag:
        doc = as_json(findings, versions, slurm_conf=conf_path,
                      config=config_mod.resolve_path(config_path)[0])
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(render_table(findings))
    ok = not any(f.status == "fail" for f in findings)
    click.get_current_context().exit(EXIT_OK if ok else EXIT_UNHEALTHY)
