"""``jobwrap login-guard [--once] [--dry-run]`` and ``jobwrap login-guard status [--json]``."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from wrapper import config as config_mod
from wrapper import log
from wrapper.loginguard.state import GuardState, StateStore

if TYPE_CHECKING:
    from wrapper.loginguard.guard import CycleReport


def _config() -> config_mod.Config:
    root = click.get_current_context().find_root()
    path = (root.obj or {}).get("config_path")
    return config_mod.load(path)


@click.group("login-guard", invoke_without_command=True)
@click.option("--once", is_flag=True, help="Scan once (after a 1 s CPU sample), act, exit.")
@click.option("--dry-run", is_flag=True,
              help="Report what would be done; touch no process and write no state.")
@click.pass_context
def login_guard(ctx: click.Context, once: bool, dry_run: bool) -> None:
    """Keep training, inference and heavy compute off this login node (root, a service)."""
    if ctx.invoked_subcommand is not None:
        return
    from wrapper.loginguard.guard import Guard
    from wrapper.loginguard.scan import raise_open_file_limit

    cfg = _config()
    log.configure(file=cfg.log.file, level=cfg.log.level, stderr_format=cfg.log.stderr_format)
    log.bind(component="login-guard", node=socket.gethostname())
    raise_open_file_limit()
    store = StateStore(Path(cfg.paths.state_dir) / "login-guard")
    # The lock first: the state is read only by the one guard that may write it.
    lock = None if dry_run else store.lock()
    try:
        guard = Guard(cfg, dry_run=dry_run, store=store)
        try:
            if once:
                _report(guard.run_once(), dry_run)
                return
            signal.signal(signal.SIGTERM, guard.request_stop)
            signal.signal(signal.SIGINT, guard.request_stop)
            guard.run_forever()
        finally:
            guard.close()
    finally:
        if lock is not None:
            os.close(lock)


def _report(report: CycleReport, dry_run: bool) -> None:
    click.echo(f"scanned {report.processes} processes ({report.watched} watched), "
               f"{len(report.findings)} rule(s) broken, {len(report.actions)} "
               f"action(s){' (dry run: none taken)' if dry_run else ''}")
    for finding in report.findings:
        click.echo(f"  {finding.user} {finding.rule}: {finding.seen}")
        targets = ", ".join(str(t.pid) for t in finding.targets)
        click.echo(f"    may act on: {targets or 'none (only protected or idle processes)'}")
    for record in report.actions:
        click.echo(f"  {record.action} {record.user} {record.rule}: {record.detail}")


@login_guard.command("status")
@click.option("--json", "as_json", is_flag=True, help="The state file's content as JSON.")
@click.option("--last", default=20, show_default=True, help="How many past actions to show.")
def status(as_json: bool, last: int) -> None:
    """Show current offenders, throttles, pending kills and the last actions taken."""
    cfg = _config()
    store = StateStore(Path(cfg.paths.state_dir) / "login-guard")
    state, problem = _read_only(store)
    if as_json:
        click.echo(json.dumps({"state_file": str(store.path), "problem": problem,
                               **state.to_json()}, indent=2))
        return
    if problem:
        click.echo(f"warning: {problem}", err=True)
    now = time.time()
    click.echo(f"login guard state: {store.path}")
    violations = sorted(state.violations.values(), key=lambda v: (v.user, v.rule))
    click.echo(f"\noffenders ({len(violations)}):")
    _table(["user", "uid", "rule", "since", "last seen", "steps", "last step", "seen"],
           [[v.user, v.uid, v.rule, _ago(now, v.since), _ago(now, v.last_seen), v.stage,
             v.last_action or "-", v.seen] for v in violations])
    if state.throttles:
        click.echo(f"\nthrottled ({len(state.throttles)}):")
        _table(["user", "uid", "how", "since"],
               [[t.user, t.uid, t.method + (f" {t.cgroup_file}" if t.cgroup_file else ""),
                 _ago(now, t.since)] for t in state.throttles.values()])
    if state.pending_kills:
        click.echo(f"\nawaiting SIGKILL ({len(state.pending_kills)}):")
        _table(["user", "pid", "rule", "due"],
               [[k.user, k.pid, k.rule, _ago(now, k.deadline)] for k in state.pending_kills])
    shown = state.history[-last:] if last > 0 else []
    click.echo(f"\nactions (last {len(shown)} of {len(state.history)}):")
    _table(["time", "action", "user", "rule", "pids", "detail"],
           [[time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a.ts)),
             a.action + (" (dry run)" if a.dry_run else "") + ("" if a.ok else " FAILED"),
             a.user, a.rule or "-", ",".join(map(str, a.pids)) or "-", a.detail]
            for a in shown])


def _read_only(store: StateStore) -> tuple[GuardState, str]:
    """Load without setting a damaged file aside: status must change nothing."""
    try:
        raw = store.path.read_bytes()
    except FileNotFoundError:
        return GuardState(), f"no state yet ({store.path} does not exist)"
    except OSError as exc:
        return GuardState(), f"cannot read {store.path}: {exc.strerror}"
    try:
        return GuardState.from_json(json.loads(raw)), ""
    except (ValueError, KeyError, TypeError) as exc:
        return GuardState(), f"{store.path} is unreadable: {exc}"


def _ago(now: float, ts: float) -> str:
    delta = int(now - ts)
    stamp = time.strftime("%H:%M:%S", time.localtime(ts))
    return f"{stamp} ({delta} s ago)" if delta >= 0 else f"{stamp} (in {-delta} s)"


def _table(header: list[str], rows: list[list[Any]]) -> None:
    if not rows:
        click.echo("  (none)")
        return
    text = [[str(c) for c in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in text) for i in range(len(header) - 1)]
    for row in text:
        cells = [c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)]
        click.echo("  " + "  ".join([*cells, row[-1]]))
