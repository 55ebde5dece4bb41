"""Staging: job data onto node-local scratch before the job, results back after it.

The API the hooks call (see each function's docstring)::

    user = UserIds.for_job(ctx.user, ctx.uid, ctx.gid)
    scratch = prepare_scratch(Path(cfg.paths.scratch_root), ctx.job_id, user)   # prolog
    report = stage_in([parse_stage_in(v) for v in values], scratch=scratch, user=user,
                      cache=Cache.from_config(cfg.paths.cache_root, cfg.staging),
                      settings=StageSettings.from_config(cfg.staging), progress=log_it,
                      work_dir=ctx.work_dir, timeout=seconds_left)
    report = stage_out(specs, scratch=scratch, user=user, ...)                   # epilog
    removal = remove_scratch(scratch)                                            # epilog

One module per concept: spec (directives), scratch (the per-job folder), copy (the
engine), cache (the node cache), archive (unpacking), privileges (the user's rights),
manifest (what a dataset is), report (records), stagein and stageout (the two
directions), channel and fdtree (the plumbing root relies on).
"""

from __future__ import annotations

from wrapper.staging.cache import Cache, CachedEntry
from wrapper.staging.errors import StagingError
from wrapper.staging.privileges import UserIds
from wrapper.staging.report import Progress, StageItem, StageReport, format_bytes
from wrapper.staging.scratch import Removal, prepare_scratch, remove_scratch
from wrapper.staging.settings import StageSettings
from wrapper.staging.spec import StageIn, StageOut, parse_stage_in, parse_stage_out
from wrapper.staging.stagein import stage_in
from wrapper.staging.stageout import stage_out

__all__ = [
    "Cache",
    "CachedEntry",
    "Progress",
    "Removal",
    "StageIn",
    "StageItem",
    "StageOut",
    "StageReport",
    "StageSettings",
    "StagingError",
    "UserIds",
    "format_bytes",
    "parse_stage_in",
    "parse_stage_out",
    "prepare_scratch",
    "remove_scratch",
    "stage_in",
    "stage_out",
]
