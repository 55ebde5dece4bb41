"""``jobwrap install-lua PATH``: install the job_submit.lua plugin with the site's defaults.

The plugin ships as package data (``wrapper/submit/job_submit.lua``); its ``SITE`` table,
between the ``-- BEGIN SITE`` and ``-- END SITE`` lines, is rewritten from the jobwrap
config, and the file is written atomically (slurmctld may reload it at any submit).
"""

from __future__ import annotations

import os
import re
import signal
import tempfile
from dataclasses import asdict
from importlib import resources
from pathlib import Path

import click

from wrapper.config import Config
from wrapper.errors import JobwrapError
from wrapper.fastdataclass import dataclass

PLUGIN_NAME = "job_submit.lua"
SITE_BEGIN = "-- BEGIN SITE"
SITE_END = "-- END SITE"
# Slurm keeps warn_time in 16 bits, and NO_VAL16/INFINITE16 sit at the top of the range.
MAX_SIGNAL_LEAD = 65533


class InstallError(JobwrapError):
    """The plugin could not be rendered or written."""


@dataclass(frozen=True)
class SiteDefaults:
    """The values of the plugin's SITE table (see its comments for what each does)."""

    requeue: bool = True
    max_restarts: int = 3
    max_restarts_limit: int = -1
    signal_name: str = "URG"
    signal_number: int = 23
    signal_lead: int = 300
    spare_nodes: str = ""
    batch_wrapper: str = ""

    @classmethod
    def from_config(cls, cfg: Config, *, requeue: bool = True) -> SiteDefaults:
        """The site's defaults and limits, from its config: the values root's hooks hold
        jobs to as well (``directives.allowed_restarts``)."""
        from wrapper.submit.directives import JobOptions, allowed_restarts

        name, number = signal_of(cfg.supervisor.walltime_signal)
        lead = round(cfg.supervisor.walltime_lead)
        if lead > MAX_SIGNAL_LEAD:
            raise InstallError(f"[supervisor] walltime_lead = {cfg.supervisor.walltime_lead:g}: "
                               f"Slurm's --signal allows at most {MAX_SIGNAL_LEAD} s")
        return cls(requeue=requeue, max_restarts=allowed_restarts(JobOptions(), cfg),
                   max_restarts_limit=cfg.restart.max_restarts_limit, signal_name=name,
                   signal_number=number, signal_lead=lead,
                   spare_nodes=spare_defaults(cfg.restart.spare_nodes),
                   batch_wrapper=batch_wrapper(cfg.restart.batch_wrapper))


def batch_wrapper(text: str) -> str:
    """``[restart] batch_wrapper`` checked: "" (off), or an absolute path of plain
    characters, which job_submit.lua quotes into every wrapped script."""
    if text and not (text.startswith("/") and re.fullmatch(r"[\w./+=,:@-]+", text)
                     and len(text) <= 1024):
        raise InstallError(f"[restart] batch_wrapper = {text!r}: give the absolute path of "
                           "the jobwrap command on the compute nodes (letters, digits and "
                           "./_+=,:@- only), e.g. \"/opt/jobwrap/bin/jobwrap\", or \"\" for off")
    return text


def spare_defaults(text: str) -> str:
    """``[restart] spare_nodes`` checked: ``PART=N`` items, comma-separated, N 0 to 64."""
    from wrapper.submit.directives import MAX_SPARE_NODES

    items = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, eq, count = (s.strip() for s in item.partition("="))
        if not (eq and name and count.isdigit() and len(count) <= 3
                and int(count) <= MAX_SPARE_NODES and re.fullmatch(r"[^\s=,]+", name)):
            raise InstallError(f"[restart] spare_nodes = {text!r}: {item!r} is not PART=N "
                               f"(N from 0 to {MAX_SPARE_NODES}), e.g. \"gpu=1,big=2\"")
        items.append(f"{name}={int(count)}")
    return ",".join(items)


def signal_of(text: str) -> tuple[str, int]:
    """``USR1``, ``SIGUSR1`` or ``10`` -> (``USR1``, 10), as sbatch --signal reads them."""
    value = text.strip().upper()
    try:
        if value.isdigit():
            found = signal.Signals(int(value))
        else:
            found = signal.Signals[value if value.startswith("SIG") else f"SIG{value}"]
    except (KeyError, ValueError):
        raise InstallError(f"[supervisor] walltime_signal = {text!r} is not a signal "
                           "(e.g. USR1, SIGTERM, 10)") from None
    return found.name.removeprefix("SIG"), int(found.value)


def template() -> str:
    """The plugin as shipped, with its built-in SITE defaults."""
    return (resources.files("wrapper.submit") / PLUGIN_NAME).read_text(encoding="utf-8")


def render(site: SiteDefaults, source: str = "") -> str:
    """The plugin with ``site`` written into its SITE table."""
    text = template()
    begin, end = text.find(SITE_BEGIN), text.find(SITE_END)
    if begin < 0 or end < begin:
        raise InstallError(f"{PLUGIN_NAME} lacks its {SITE_BEGIN} ... {SITE_END} block")
    block = text[begin:end]
    for key, value in asdict(site).items():
        block, count = _set_site_value(block, key, _lua(value))
        if count != 1:
            raise InstallError(f"{PLUGIN_NAME}: SITE.{key} appears {count} times, not once")
    first_line, _, rest = block.partition("\n")
    origin = f" (written by `jobwrap install-lua` from {source})" if source else ""
    head = f"{SITE_BEGIN}{origin}" if origin else first_line
    return text[:begin] + head + "\n" + rest + text[end:]


def _set_site_value(block: str, key: str, literal: str) -> tuple[str, int]:
    pattern = re.compile(rf"^(\s+{key} = ).*,$", re.M)
    return pattern.subn(lambda m: m.group(1) + literal + ",", block)


def _lua(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    # Decimal escapes for anything but plain printable ASCII: valid in Lua 5.1 to 5.4.
    text = str(value).encode()
    body = "".join(chr(b) if 32 <= b < 127 and b not in b'"\\' else f"\\{b:03d}"
                   for b in text)
    return f'"{body}"'


def install(path: Path, text: str, mode: int = 0o644) -> Path:
    """Write ``text`` to ``path`` (or ``path/job_submit.lua`` for a folder) atomically."""
    target = path / PLUGIN_NAME if path.is_dir() else path
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)  # mkstemp makes 0600; slurmctld runs as SlurmUser
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


@click.command("install-lua")
@click.argument("path", type=click.Path(dir_okay=True, file_okay=True, allow_dash=True))
@click.option("--max-restarts-limit", type=click.IntRange(min=-1), default=None,
              help="Refuse jobs asking for more restarts than this (-1: no limit); "
                   "default, and the only value accepted: the config's [restart] "
                   "max_restarts_limit, which root's hooks enforce too.")
@click.option("--no-requeue-default", is_flag=True,
              help="Do not make jobs requeueable; only check their directives.")
def install_lua(path: str, max_restarts_limit: int | None, no_requeue_default: bool) -> None:
    """Install Slurm's job_submit.lua at PATH (a file, or the folder of slurm.conf; - prints
    it), with the site defaults taken from the jobwrap config.

    slurm.conf needs JobSubmitPlugins=lua, and the file must sit beside slurm.conf as
    job_submit.lua; slurmctld reads it again when it changes.
    """
    from wrapper import config

    root = click.get_current_context().find_root().obj or {}
    cfg = config.load(root.get("config_path"))
    limit = cfg.restart.max_restarts_limit
    if max_restarts_limit is not None and max_restarts_limit != limit:
        raise InstallError(f"--max-restarts-limit={max_restarts_limit} differs from the "
                           f"config's [restart] max_restarts_limit = {limit} "
                           f"({cfg.source or 'built-in defaults'}): set it there, so that "
                           "root's hooks hold jobs to the limit job_submit.lua enforces")
    site = SiteDefaults.from_config(cfg, requeue=not no_requeue_default)
    text = render(site, cfg.source)
    if path == "-":
        click.echo(text, nl=False)
        return
    try:
        target = install(Path(path), text)
    except OSError as exc:
        raise InstallError(f"cannot write {path}: {exc.strerror or exc}") from None
    click.echo(f"installed {target} (requeue={str(site.requeue).lower()}, "
               f"max_restarts={site.max_restarts}, "
               f"max_restarts_limit={site.max_restarts_limit}, "
               f"signal={site.signal_name}@{site.signal_lead})")
