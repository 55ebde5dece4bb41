"""Slurm's hooks (prolog, epilog, task-prolog): the shared frame every hook runs in.

The frame owns the invariants: a bad config or a bug in jobwrap is logged loudly and,
by default, lets the job run (``[hooks] on_internal_error``); it never looks like a
node fault. A file in a newer jobwrap's format (``FormatTooNew``, docs/upgrades.md) is
logged in one line and never drains, whatever that setting says. Exit codes: 0 healthy,
1 unhealthy node, 2 jobwrap broken (by hand only: inside Slurm a broken jobwrap exits 0,
or drains with a precise reason if so configured).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import TextIO

from wrapper import config as config_mod
from wrapper import log
from wrapper.config import Config
from wrapper.errors import (
    EXIT_BROKEN,
    EXIT_OK,
    EXIT_UNHEALTHY,
    ConfigError,
    FormatTooNew,
    JobwrapError,
)
from wrapper.hooks.services import Services
from wrapper.slurm.context import JobContext, from_env

HookBody = Callable[[JobContext, Config, TextIO, Mapping[str, str], Services], int]


def _body(hook: str) -> HookBody:
    # Imported on demand: each hook pays only for its own code.
    if hook == "prolog":
        from wrapper.hooks.prolog import run
    elif hook == "epilog":
        from wrapper.hooks.epilog import run
    else:
        from wrapper.hooks.task_prolog import run
    return run


def run_hook(hook: str, *, config_path: str | None, env: Mapping[str, str] | None = None,
             out: TextIO | None = None, services: Services | None = None) -> int:
    environ = os.environ if env is None else env
    stdout = out if out is not None else sys.stdout
    under_slurm = bool(environ.get("SLURM_SCRIPT_CONTEXT")) or (
        hook == "task-prolog" and bool(environ.get("SLURM_JOB_ID")))
    config_problem: ConfigError | None = None
    try:
        cfg = config_mod.load(config_path, dict(environ))
    except ConfigError as exc:
        cfg, config_problem = Config(), exc
    log.configure(file=cfg.log.file if hook != "task-prolog" else "",
                  level=cfg.log.level, stderr_format=cfg.log.stderr_format)
    logger = log.get()
    try:
        if config_problem is not None:
            raise config_problem
        ctx = from_env(hook, environ)
        log.bind(hook=hook, job_id=ctx.job_id, node=ctx.node, attempt=ctx.attempt)
        return _body(hook)(ctx, cfg, stdout, environ, services or Services(cfg))
    except FormatTooNew as exc:
        # A newer jobwrap's files (an upgrade not on every node yet, a downgrade): neither
        # a node fault nor a bug here, so never a drain, whatever on_internal_error says.
        # The hook stops where it met them; the one line says what to do.
        logger.error("hook.format_too_new", hook=hook, error=str(exc), path=exc.path)
        return EXIT_OK if under_slurm else EXIT_BROKEN
    except JobwrapError as exc:
        logger.error("hook.failed", hook=hook, error=str(exc), kind=type(exc).__name__)
        return _on_internal_error(hook, cfg, environ, str(exc), under_slurm)
    except Exception as exc:  # a bug: loud, with the traceback, but not a node fault
        logger.exception("hook.bug", hook=hook, error=repr(exc))
        return _on_internal_error(hook, cfg, environ, f"internal error {exc!r}", under_slurm)


def _on_internal_error(hook: str, cfg: Config, env: Mapping[str, str], why: str,
                       under_slurm: bool) -> int:
    if not under_slurm:
        return EXIT_BROKEN
    if hook == "task-prolog" or cfg.hooks.on_internal_error == "run":
        return EXIT_OK
    node = env.get("SLURMD_NODENAME", "")
    if node:
        from wrapper import slurm

        try:
            slurm.backend(cfg.slurm).drain_node(node, f"jobwrap: {hook} broken: {why}"[:200])
        except JobwrapError as exc:
            log.get().error("hook.drain_failed", error=str(exc))
    return EXIT_UNHEALTHY
