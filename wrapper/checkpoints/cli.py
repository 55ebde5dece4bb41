"""``jobwrap checkpoints latest DIR``: the newest complete checkpoint, for people and scripts.

Output without ``--json``: the checkpoint's path alone on stdout (so that
``$(jobwrap checkpoints latest DIR)`` is the path), then on stderr its layout and step
and one ``skipped PATH: REASON`` line per newer candidate passed over.

Output with ``--json`` (a stable shape; keys are only ever added)::

    {"latest": {"path": str, "layout": str, "step": int | null, "mtime": float} | null,
     "skipped": [{"path": str, "reason": str}, ...],
     "layout": str | null}

Exit status: 0 a checkpoint was found; 1 none is valid (a missing directory included:
a first attempt has none yet); 2 bad input (a marker without a glob, a glob with ``/``,
a negative settle time).
"""

from __future__ import annotations

import json
import sys

import click

from wrapper.checkpoints import latest_valid

EXIT_FOUND = 0
EXIT_NONE = 1


@click.group()
def checkpoints() -> None:
    """Find checkpoints and tell complete ones from partial ones."""


@checkpoints.command()
@click.argument("directory", metavar="DIR")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON on stdout.")
@click.option("--glob", "glob", metavar="G", default=None,
              help="Generic layout: checkpoint names matching G (one name pattern).")
@click.option("--marker", metavar="M", default=None,
              help="Generic layout: completion marker, DIR/NAME/M for a directory, NAME+M "
                   "beside a file. Needs --glob.")
@click.option("--settle", "settle", type=float, default=10.0, show_default=True, metavar="S",
              help="Seconds since the last modification before a checkpoint counts as "
                   "written.")
def latest(directory: str, as_json: bool, glob: str | None, marker: str | None,
           settle: float) -> None:
    """Print the newest complete checkpoint in DIR (exit 1 when there is none)."""
    found = latest_valid(directory, glob=glob, marker=marker, settle_seconds=settle)
    if as_json:
        click.echo(json.dumps(found.as_dict(), indent=2))
    else:
        if found.latest is not None:
            click.echo(found.latest.path)
            step = "unknown" if found.latest.step is None else found.latest.step
            click.echo(f"layout={found.latest.layout} step={step}", err=True)
        else:
            click.echo(f"no valid checkpoint in {directory}", err=True)
        for skipped in found.skipped:
            click.echo(f"skipped {skipped.path}: {skipped.reason}", err=True)
    sys.exit(EXIT_FOUND if found.latest is not None else EXIT_NONE)
