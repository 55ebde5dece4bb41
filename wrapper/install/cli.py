"""``jobwrap install`` / ``jobwrap uninstall``: the click layer over ``installer``."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import click

from wrapper.install import installer

_ROLE = click.Choice(installer.ROLES)


def _config_path() -> Path:
    from wrapper import config

    root = click.get_current_context().find_root().obj or {}
    return Path(config.resolve_path(root.get("config_path"))[0])


def _program() -> Path:
    """The jobwrap command of this install: the venv's, beside the Python running this."""
    beside = Path(sys.executable).parent / "jobwrap"
    return beside if os.access(beside, os.X_OK) else Path(sys.argv[0]).absolute()


def _run(argv: list[str]) -> None:
    from wrapper.runner import Runner

    Runner().run(argv, timeout=120)


def _slurm_conf(given: str | None) -> Path:
    """The cluster's slurm.conf as Slurm is given it (a link is followed where it is
    edited: installer._plan_slurm_conf)."""
    from wrapper.slurm.conf import DEFAULT_SLURM_CONF

    return Path(given or os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF)


@click.command("install")
@click.option("--role", "roles", type=_ROLE, multiple=True,
              help="compute, controller or login (repeat for a host with several) "
                   "[default: read from slurm.conf: a SlurmctldHost is a controller, a "
                   "node's host a compute node, any other host a login node].")
@click.option("--prefix", default=installer.DEFAULT_PREFIX, show_default=True,
              help="Where the hooks go (prolog/, epilog/, jobwrap.env, the install record).")
@click.option("--slurm-conf", metavar="PATH",
              help="The cluster's slurm.conf [default: $SLURM_CONF, else "
                   "/etc/slurm/slurm.conf]; job_submit.lua goes beside it.")
@click.option("--systemd-dir", default=installer.DEFAULT_SYSTEMD_DIR, show_default=True,
              help="Where the systemd units go.")
@click.option("--host", metavar="NAME",
              help="This host's name as slurm.conf knows it (NodeHostname, SlurmctldHost) "
                   "[default: the short hostname].")
@click.option("--dry-run", is_flag=True, help="Print every change as a diff; change nothing.")
@click.option("--no-doctor", is_flag=True,
              help="Do not run `jobwrap doctor` at the end (an image built without Slurm "
                   "running).")
def install(roles: tuple[str, ...], prefix: str, slurm_conf: str | None, systemd_dir: str,
            host: str | None, dry_run: bool, no_doctor: bool) -> None:
    """Install jobwrap on this host for its role: the hooks, their settings, the config
    (when absent), the folders, slurm.conf's lines merged into the site's, job_submit.lua
    beside it, the systemd units, then `jobwrap doctor`.

    Run it again after an upgrade or a config change: it changes only what differs. A
    slurm.conf it cannot merge (another Prolog, a key set twice or in an Include) stops it
    with the reason, before anything is written. Exit status: 0 installed and the doctor
    found no failure, 1 the doctor found one, 2 it stopped (before writing anything, or
    part-way with what it did in its record, for `jobwrap uninstall`).
    """
    conf = _slurm_conf(slurm_conf)
    host = host or socket.gethostname().split(".")[0]
    chosen = list(roles) or installer.detect_roles(conf, host)
    how = "as asked" if roles else "read from slurm.conf; --role to choose"
    config_path = _config_path()
    plan = installer.plan(roles=chosen, prefix=Path(prefix), config_path=config_path,
                          slurm_conf=conf, systemd_dir=Path(systemd_dir), program=_program(),
                          host=host)
    click.echo(f"jobwrap install: {', '.join(plan.roles)} ({how})")
    if dry_run:
        shown = installer.diff(plan)
        click.echo(shown if shown else "nothing to change", nl=not shown)
        for note in plan.notes:
            click.echo(f"note: {note}")
        return
    if os.geteuid() != 0:
        raise installer.InstallError("run it as root (it writes root's hooks and slurm.conf);"
                                     " --dry-run shows what it would change")
    slurm_changed = any(f.changes and f.path == plan.slurm_conf for f in plan.files)
    done = installer.apply(plan, run=_run)
    for line in done:
        click.echo(f"  {line}")
    if not done:
        click.echo("  nothing to change: installed as this release ships it")
    for note in plan.notes:
        click.echo(f"note: {note}")
    if slurm_changed:
        click.echo(f"next: {conf} changed: `scontrol reconfigure` (or restart slurmctld and "
                   "slurmd) once every node has it")
    if no_doctor:
        return
    from wrapper import doctor

    _, nodes = _nodes(conf, host)
    findings, _ = doctor.diagnose(config_path=str(config_path), slurm_conf=str(conf),
                                  node=nodes[0] if nodes else host)
    click.echo(doctor.render_table(findings))
    if any(f.status == "fail" for f in findings):
        click.get_current_context().exit(1)


def _nodes(conf: Path, host: str) -> tuple[bool, list[str]]:
    from wrapper.install import slurmconf

    if not conf.exists():
        return False, []
    try:
        return slurmconf.host_nodes(conf, host)
    except slurmconf.SlurmConfError:
        return False, []


@click.command("uninstall")
@click.option("--prefix", default=installer.DEFAULT_PREFIX, show_default=True,
              help="Where `jobwrap install` put the hooks (its record is there).")
@click.option("--purge", is_flag=True, help="Also remove the folders of jobs' data it made "
              "(state, scratch, cache, logs); the archive always stays.")
@click.option("--dry-run", is_flag=True, help="Say what it would do; change nothing.")
def uninstall(prefix: str, purge: bool, dry_run: bool) -> None:
    """Take out what `jobwrap install` put in, from its record: files it added go, files it
    changed get their old text back (slurm.conf edited since keeps the site's edits, less
    jobwrap's lines), units it enabled are disabled. Then lists the nodes jobwrap drained
    (they stay drained: their faults are real) and jobwrap's processes still running.
    """
    if os.geteuid() != 0 and not dry_run:
        raise installer.InstallError("run it as root (it restores root's files); --dry-run "
                                     "shows what it would do")
    record = installer.read_record(Path(prefix))
    sinfo = _sinfo()  # the site's Slurm, read before its config may go
    undone = installer.uninstall(Path(prefix), purge=purge, dry_run=dry_run, run=_run)
    for line in undone.done:
        click.echo(f"  {line}")
    for line in undone.kept:
        click.echo(f"kept: {line}")
    conf = (record or {}).get("slurm_conf") or ""
    if conf and not dry_run:
        click.echo(f"next: {conf} changed: `scontrol reconfigure` once every node has it")
    for line in _left_behind(conf, (record or {}).get("program", ""), sinfo):
        click.echo(line)


def _sinfo() -> str:
    """The config's sinfo (a site's Slurm may not be the one on PATH)."""
    from wrapper import config
    from wrapper.errors import ConfigError

    try:
        return config.load(str(_config_path())).slurm.sinfo_command
    except ConfigError:
        return "sinfo"


def _left_behind(conf: str, program: str, sinfo: str) -> list[str]:
    """The nodes drained with a jobwrap: reason, and jobwrap's processes still running."""
    import psutil

    from wrapper.runner import Runner

    out: list[str] = []
    env = {**os.environ, **({"SLURM_CONF": conf} if conf else {})}
    try:
        res = Runner(env).run([sinfo, "-h", "-N", "-R", "-o", "%N|%E"], timeout=30,
                              check=False)
        drained = sorted({line.split("|", 1)[0] for line in res.stdout.splitlines()
                          if "|jobwrap:" in line})
        if res.returncode != 0:
            out.append(f"drained nodes: not known (sinfo: {res.stderr.strip()[:200]})")
        elif drained:
            out.append(f"drained by jobwrap (they stay drained: `scontrol update "
                       f"NodeName=... State=RESUME` once fixed): {', '.join(drained)}")
        else:
            out.append("no node is drained with a jobwrap: reason")
    except Exception as exc:  # no Slurm here: say so, uninstall is done
        out.append(f"drained nodes: not known ({exc})")
    if program:
        running = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmdline = proc.info["cmdline"] or []
            if program in cmdline[:2] and proc.info["pid"] != os.getpid():
                running.append(str(proc.info["pid"]))
        if running:
            out.append(f"jobwrap processes still running (their jobs' supervisors and "
                       f"watchers; they end with their jobs): pids {', '.join(running)}")
    return out
