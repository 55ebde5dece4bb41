"""The ``jobwrap`` program's entry point: Slurm's hooks straight to their frame, the rest
to the click command line.

Slurm runs ``jobwrap prolog`` on the start path of every job (``epilog`` and
``task-prolog`` likewise): importing click and building the whole command group would be
a large part of the hook's own time, so exactly those command lines skip it. Any other
command line, ``jobwrap prolog --help`` and ``jobwrap -v prolog`` included, goes to
click, which does the same for them (tests/unit/hooks/test_entry.py keeps the two in step).
"""

from __future__ import annotations

import os
import sys

HOOKS = ("prolog", "epilog", "task-prolog")
CONFIG_ENV = "JOBWRAP_CONFIG"  # what ``--config`` defaults to, as in wrapper.cli


def hook_of(argv: list[str]) -> str | None:
    """The hook a command line runs with nothing else to parse (``jobwrap prolog``)."""
    return argv[0] if len(argv) == 1 and argv[0] in HOOKS else None


def run_hook_now(hook: str) -> int:
    """What ``jobwrap HOOK`` does through click, without click."""
    from wrapper.errors import JobwrapError
    from wrapper.hooks import run_hook

    try:
        # click reads an empty variable as unset: so does this.
        return run_hook(hook, config_path=os.environ.get(CONFIG_ENV) or None)
    except JobwrapError as exc:
        print(f"jobwrap: error: {exc}", file=sys.stderr)
        return exc.exit_code


def main() -> None:
    hook = hook_of(sys.argv[1:])
    if hook is not None:
        sys.exit(run_hook_now(hook))
    from wrapper.cli import main as click_main

    click_main()
