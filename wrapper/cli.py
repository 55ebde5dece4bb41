"""The ``jobwrap`` command: a thin click layer that calls one module per verb.

Imports are deferred into each command so that the prolog, on the start path of
every job, loads nothing it does not use. Errors become one-line messages and the
documented exit codes here, in one place; ``-v`` shows tracebacks.
"""

from __future__ import annotations

import sys
from typing import Any, ClassVar

import click

from wrapper import __version__


class _Group(click.Group):
    """Maps errors to exit codes, and loads heavy verb groups only when they are called."""

    lazy: ClassVar[dict[str, str]] = {"checkpoints": "wrapper.checkpoints.cli:checkpoints",
                                      "login-guard": "wrapper.loginguard.cli:login_guard",
                                      "check": "wrapper.gpu.cli:check",
                                      "doctor": "wrapper.doctor:doctor",
                                      "install-lua": "wrapper.submit.lua:install_lua",
                                      "install": "wrapper.install.cli:install",
                                      "uninstall": "wrapper.install.cli:uninstall",
                                      "archive": "wrapper.archive.cli:archive",
                                      "status": "wrapper.goodput.cli:status",
                                      "report": "wrapper.goodput.cli:report"}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            import importlib

            module, _, attr = self.lazy[name].partition(":")
            command: click.Command = getattr(importlib.import_module(module), attr)
            return command
        return super().get_command(ctx, name)

    def invoke(self, ctx: click.Context) -> Any:
        from wrapper.errors import JobwrapError

        try:
            return super().invoke(ctx)
        except JobwrapError as exc:
            if ctx.params.get("verbose"):
                raise
            click.echo(f"jobwrap: error: {exc}", err=True)
            ctx.exit(exc.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", envvar="JOBWRAP_CONFIG", metavar="PATH",
              help="Config file [env: JOBWRAP_CONFIG; default: /etc/jobwrap/config.toml].")
@click.option("-v", "--verbose", is_flag=True, help="Show tracebacks of errors.")
@click.version_option(__version__, prog_name="jobwrap")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, verbose: bool) -> None:
    """jobwrap: GPU health, staging, supervision and self-healing restarts for Slurm jobs."""
    ctx.obj = {"config_path": config_path, "verbose": verbose}


def _config_path() -> str | None:
    path: str | None = click.get_current_context().find_root().obj["config_path"]
    return path


def _hook(name: str) -> None:
    from wrapper.hooks import run_hook

    sys.exit(run_hook(name, config_path=_config_path()))


@cli.command()
def prolog() -> None:
    """Slurm Prolog (root, each allocated node)."""
    _hook("prolog")


@cli.command()
def epilog() -> None:
    """Slurm Epilog (root, each allocated node)."""
    _hook("epilog")


@cli.command("task-prolog")
def task_prolog() -> None:
    """Slurm TaskProlog (job user): prints the JOBWRAP_* exports."""
    _hook("task-prolog")


@cli.command()
@click.argument("job_id")
def supervise(job_id: str) -> None:
    """Follow one job until it ends (started by the prolog; runs as the job user)."""
    from wrapper import config, log
    from wrapper.supervisor.launch import supervise as run_supervisor

    cfg = config.load(_config_path())
    log.configure(file="", level=cfg.log.level, stderr_format=cfg.log.stderr_format)
    sys.exit(run_supervisor(job_id, cfg))


@cli.command(hidden=True)
@click.argument("job_id")
@click.option("--exclude", multiple=True, help="Nodes this job must not run on again.")
@click.option("--running-grace", type=float, default=0.0, hidden=True,
              help="Seconds a job still RUNNING is waited for (started by a failing prolog).")
def release(job_id: str, exclude: tuple[str, ...], running_grace: float) -> None:
    """Make a requeued job eligible as soon as Slurm allows (started by the epilog)."""
    from wrapper import config, log
    from wrapper.restart.release import release as do_release

    cfg = config.load(_config_path())
    log.configure(file=cfg.log.file, level=cfg.log.level, stderr_format="logfmt")
    log.bind(hook="release", job_id=job_id)
    sys.exit(0 if do_release(job_id, cfg, list(exclude), running_grace=running_grace) else 1)


class _RunCommand(click.Command):
    """``jobwrap run``: its options are the directives', listed from their one table."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from wrapper.submit.directives import OPTIONS

        rows = [(o.name + ("" if o.kind == "flag" else f"={o.kind.upper()}"), o.help)
                for o in OPTIONS]
        with formatter.section("Options (the #JOBWRAP directives'; given here, they win)"):
            formatter.write_dl([*rows, ("-h, --help", "Show this message and exit.")])


@cli.command("run", cls=_RunCommand, context_settings={"allow_interspersed_args": False,
                                                      "ignore_unknown_options": True})
@click.argument("words", nargs=-1, required=True, metavar="-- CMD [ARGS]...")
def run_command(words: tuple[str, ...]) -> None:
    """Run CMD, restarting it in place from its latest valid checkpoint when it fails.

    Each option below may also come from the job's #JOBWRAP lines and the site's
    defaults; a relative --checkpoint-dir is the job's work dir's. A node root found
    faulty ends the command for a requeue away from it, or, with --spare-nodes, moves
    the work onto a spare inside the allocation.
    """
    from wrapper import config, log
    from wrapper.restart.runloop import run
    from wrapper.submit import directives

    option_words, command = directives.split_run_args(list(words))
    if not command:
        raise click.UsageError("no command given: jobwrap run [OPTIONS] -- CMD [ARGS]...")
    options = directives.parse_args(option_words)
    cfg = config.load(_config_path())
    log.configure(file="", level="warning", stderr_format=cfg.log.stderr_format)
    sys.exit(run(command, options, cfg))


@cli.group("config")
def config_group() -> None:
    """Show or check the configuration."""


@config_group.command("show")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of TOML.")
def config_show(as_json: bool) -> None:
    """Print the effective configuration (defaults merged with the file)."""
    import json

    from wrapper import config

    cfg = config.load(_config_path())
    if as_json:
        click.echo(json.dumps({"source": cfg.source, **cfg.as_dict()}, indent=2))
    else:
        click.echo(config.to_toml(cfg), nl=False)


@config_group.command("validate")
def config_validate() -> None:
    """Check the configuration file; exit 2 with every problem listed if it is invalid."""
    from wrapper import config

    cfg = config.load(_config_path())
    click.echo(f"ok: {cfg.source}")


@config_group.command("defaults")
def config_defaults() -> None:
    """Print every key with its default and what it does."""
    from wrapper import config

    click.echo(config.defaults_toml(), nl=False)


def main() -> None:
    cli(prog_name="jobwrap")
