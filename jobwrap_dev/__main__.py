"""``python -m jobwrap_dev sandbox up|down|status|demo`` (from a checkout)."""

from __future__ import annotations

import click

from jobwrap_dev.sandbox.cli import sandbox


@click.group()
def main() -> None:
    """jobwrap's development tools (not installed on nodes)."""


main.add_command(sandbox)

if __name__ == "__main__":
    main()
