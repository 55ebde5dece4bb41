"""``python -m jobwrap_dev sandbox up|down|status|demo`` (from a checkout)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from jobwrap_dev.sandbox.cluster import DEFAULT_BASE, RECORD, Cluster, Spec

_base = click.option("--base", type=click.Path(path_type=Path), default=DEFAULT_BASE,
                     show_default=True, help="Folder that holds the whole cluster.")


def _cluster(base: Path) -> Cluster:
    record = base / RECORD
    if record.exists():
        return Cluster(Spec(**json.loads(record.read_text())["spec"]))
    return Cluster(Spec(base=str(base)))


@click.group()
def sandbox() -> None:
    """A real Slurm cluster on this machine (root): slurmctld + 2 slurmd, 4 fake GPUs each."""


@sandbox.command()
@_base
def up(base: Path) -> None:
    """Install what is missing, start the cluster, wait until its nodes are idle."""
    cluster = _cluster(base)
    cluster.up(log=click.echo)
    click.echo(f"try: SLURM_CONF={cluster.conf} sinfo -N   "
               "(stop: python -m jobwrap_dev sandbox down)")


@sandbox.command()
@_base
def down(base: Path) -> None:
    """Stop the processes the sandbox started (by pid); leave its files for inspection."""
    cluster = _cluster(base)
    if (base / RECORD).exists():
        cluster.load()
    stopped = cluster.down()
    click.echo(f"stopped: {', '.join(stopped) or 'nothing was running'}")


@sandbox.command()
@_base
def status(base: Path) -> None:
    """Say whether the sandbox runs, and its nodes' states."""
    cluster = _cluster(base)
    if not cluster.running():
        click.echo(f"sandbox in {base}: not running")
        raise SystemExit(1)
    for node, state in sorted(cluster.node_states().items()):
        click.echo(f"{node}: {state}")


@sandbox.command()
@_base
@click.option("--keep", is_flag=True, help="Leave the cluster running afterwards.")
def demo(base: Path, keep: bool) -> None:
    """Bring the cluster up and show jobwrap at work in six labelled parts (README)."""
    from jobwrap_dev.sandbox.demo import run_demo

    cluster = _cluster(base)
    was_running = cluster.running()
    cluster.up(log=click.echo)
    try:
        run_demo(cluster, click.echo)
    finally:
        if keep or was_running:
            click.echo(f"\ncluster still up: SLURM_CONF={cluster.conf} squeue; "
                       "stop it with: python -m jobwrap_dev sandbox down")
        else:
            cluster.down()
            click.echo("\ncluster stopped "
                       "(keep it with: python -m jobwrap_dev sandbox demo --keep)")
