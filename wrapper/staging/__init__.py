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
directions; a stage-in's server is root's side, its worker the user's), messages (what
the two sides say, typed, and the one decoder that bounds it), channel (the plumbing root
relies on). Folders are walked, made and removed through ``wrapper.osl.dirs``
(descriptors, never a symlink).
"""

from __future__ import annotations

import importlib
from typing import Any

# Names load on first use: a prolog with nothing to stage imports only the scratch code,
# not the copy engine, the cache and the archive readers (tarfile, zipfile, lzma).
_EXPORTS = {
    "Cache": "cache", "CachedEntry": "cache", "StagingError": "errors",
    "UserIds": "privileges", "Progress": "report", "StageItem": "report",
    "StageReport": "report", "format_bytes": "report", "Removal": "scratch",
    "prepare_scratch": "scratch", "remove_scratch": "scratch", "StageSettings": "settings",
    "StageIn": "spec", "StageOut": "spec", "parse_stage_in": "spec",
    "parse_stage_out": "spec", "stage_in": "stagein", "stage_out": "stageout",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"wrapper.staging.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'wrapper.staging' has no attribute {name!r}")
