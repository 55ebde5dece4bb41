"""The node watcher's files in the job's root-owned state folder, and their one format.

``watch-<node>.json`` (``pid_file``): the watcher's pid and start time, by which the
epilog stops it (``wrapper.watch.process``). ``forensics-<node>.json``
(``forensics_file``): a hang's forensics on that node, archived with the attempt
(``wrapper.watch.forensics``). Both carry ``"format": WATCH_FORMAT`` (docs/upgrades.md).
"""

from __future__ import annotations

# An epilog finds the watcher by its pid file (and by its module in its command line):
# both outlive an upgrade under a running job.
WATCH_FORMAT = 1


def pid_file(node: str) -> str:
    return f"watch-{node}.json"


def forensics_file(node: str) -> str:
    return f"forensics-{node}.json"
