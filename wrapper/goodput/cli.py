"""``jobwrap report [--since 7d] [--json] [--user NAME]``: goodput over the archive.

``--json`` prints ``{report: Report, problems: [str]}`` (keys are only ever added).
"""

from __future__ import annotations

import json
import time

import click


@click.command()
@click.option("--since", metavar="WHEN", default="7d", show_default=True,
              help="Jobs archived since WHEN: a date (2024-05-01), a date and time "
                   "(2024-05-01T12:00) or a time back from now (12h, 7d).")
@click.option("--user", metavar="NAME", default=None, help="Only this user's jobs.")
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
def report(since: str, user: str | None, as_json: bool) -> None:
    """Goodput of the archived jobs: failures by class and node, flaky nodes, MTBF,
    restart gaps, the ETTR distribution."""
    from wrapper.archive.cli import current_config, open_index, parse_since
    from wrapper.goodput import report as report_mod

    cfg = current_config()
    now = time.time()
    start = parse_since(since, now)
    index = open_index(cfg)
    jobs, problems = report_mod.from_index(index, since=start, user=user) \
        if index is not None else \
        report_mod.from_archive(cfg.paths.archive_root, since=start, now=now, user=user)
    built = report_mod.build(jobs, since=start)
    if as_json:
        click.echo(json.dumps({"report": built.as_dict(), "problems": problems}, indent=2))
        return
    click.echo(report_mod.render(built), nl=False)
    for problem in problems:
        click.echo(f"jobwrap: warning: {problem}", err=True)
