"""``jobwrap status JOBID``: a job's attempts and its goodput; ``jobwrap report [--since 7d]
[--json] [--user NAME]``: goodput over the archive.

Both build on the archive (its attempts, ledgers and index), which is why they are here,
above it. ``--json`` output is a stable shape (keys are only ever added): ``status``
prints ``{job_id, state, source, attempts: [AttemptSummary], goodput: Ledger, advice}``
(source: "state" when read from this node's per-job state, "archive" when read from
the job's manifest); ``report`` prints ``{report: Report, problems: [str]}``.
"""

from __future__ import annotations

import json
import time

import click


@click.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
def status(job_id: str, as_json: bool) -> None:
    """The timeline of a job's attempts: nodes, health, checkpoints, failures, decisions."""
    from wrapper.archive import status as status_mod
    from wrapper.archive.cli import current_config, job_attempts, open_index
    from wrapper.archive.ledger import account, from_summaries
    from wrapper.goodput import advice, view

    cfg = current_config()
    found = job_attempts(cfg, job_id)
    attempts = found.attempts
    now = time.time()
    ledger = account(from_summaries(attempts), now=now)
    # the cluster's MTBF for the advice; an archived job's lookup opened it already
    index = found.index if found.source == "archive" else open_index(cfg)
    suggestion = advice.for_job(cfg.paths.archive_root, ledger, found.uid, now, index=index)
    if as_json:
        click.echo(json.dumps({"job_id": job_id, "state": status_mod.job_state(attempts)
                               if attempts else None, "source": found.source,
                               "attempts": [a.as_dict() for a in attempts],
                               "goodput": ledger.as_dict(), "advice": suggestion},
                              indent=2))
    else:
        click.echo(status_mod.render(job_id, attempts) + view.render(ledger, suggestion),
                   nl=False)


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
