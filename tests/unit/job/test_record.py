"""The job's options meet the site's defaults in one place (job.record.site_options)."""

from __future__ import annotations

from wrapper.config import Config, RestartConfig, SupervisorConfig
from wrapper.job.record import JobRecord, site_options
from wrapper.submit.directives import JobOptions, allowed_restarts


def site(restarts: int = 3, hang: float = 0.0) -> Config:
    return Config(restart=RestartConfig(max_restarts=restarts),
                  supervisor=SupervisorConfig(hang_timeout=hang))


def test_a_directive_wins_and_an_unset_one_takes_the_sites_default() -> None:
    mine = JobOptions(max_restarts=7, hang_timeout=900.0)
    assert site_options(mine, site(3, 600.0)) == mine
    merged = site_options(JobOptions(checkpoint_dir="ck"), site(3, 600.0))
    assert (merged.max_restarts, merged.hang_timeout, merged.checkpoint_dir) == (3, 600.0, "ck")
    assert allowed_restarts(JobOptions(), site(5)) == 5
    assert allowed_restarts(JobOptions(max_restarts=0), site(5)) == 0  # 0 is a value


def test_hang_timeout_off_learned_and_fixed_stay_apart() -> None:
    # the site's 0 is "no fixed default": learned (None); the job's own 0 is off
    assert site_options(JobOptions(), site(hang=0.0)).hang_timeout is None
    assert site_options(JobOptions(hang_timeout=0.0), site(hang=600.0)).hang_timeout == 0.0
    record = JobRecord(job_id="1", user="u", uid=1, gid=1, nodes=["n1"], gpus=[],
                       work_dir="/w", options={"max_restarts": 2})
    assert record.options_for(site(9, 300.0)) == JobOptions(max_restarts=2,
                                                            hang_timeout=300.0)


def test_the_sites_restart_limit_holds_whatever_the_job_asks() -> None:
    """``[restart] max_restarts_limit``: job_submit.lua refuses more at submit, but the
    job's directives can be rewritten after it (Extra, 23.02+), and the lua may predate
    the limit: root's merge holds every job to it (issue 37 item 2)."""
    limited = Config(restart=RestartConfig(max_restarts=3, max_restarts_limit=2))
    assert allowed_restarts(JobOptions(max_restarts=500), limited) == 2
    assert allowed_restarts(JobOptions(max_restarts=1), limited) == 1
    assert allowed_restarts(JobOptions(), limited) == 2  # the site's own default too
    assert allowed_restarts(JobOptions(max_restarts=500), site(3)) == 500  # -1: no limit
    zero = Config(restart=RestartConfig(max_restarts_limit=0))
    assert site_options(JobOptions(max_restarts=4), zero).max_restarts == 0
