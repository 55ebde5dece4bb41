"""Helpers of the submit tests that are not set-up: the verdict on a batch script's
directives from each side, wrapper/submit/directives.py (plus wrapper/staging/spec.py for the
stage specs, as the prolog applies them) and job_submit.lua under a real Lua."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.lua import luarun
from wrapper.errors import UserInputError
from wrapper.staging import spec
from wrapper.submit import directives
from wrapper.submit.directives import parse_script

_original_convert = directives._convert


def _convert_with_stage_rules(option: directives.Option, value: str, where: str) -> Any:
    """wrapper.submit.directives._convert plus the stage spec rules the prolog applies
    (wrapper/staging/spec.py), as job_submit.lua applies them at submit time."""
    converted = _original_convert(option, value, where)
    if option.kind == "spec":
        check = spec.parse_stage_in if option.name == "--stage-in" else spec.parse_stage_out
        try:
            check(value)
        except UserInputError as exc:
            raise UserInputError(f"{where}: {exc}") from None
    return converted


def python_verdict(script: str, *, stage_rules: bool = False) -> str | None:
    try:
        if stage_rules:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(directives, "_convert", _convert_with_stage_rules)
                parse_script(script)
        else:
            parse_script(script)
    except UserInputError as exc:
        return str(exc)
    return None


def lua_verdicts(scripts: list[str], tmp: Path, lua: str) -> list[str | None]:
    # a fixed node count, as --spare-nodes needs: the directives alone decide
    results = luarun.run_cases([luarun.submit_case(s, min_nodes=2, max_nodes=2)
                                for s in scripts], tmp, lua=lua)
    out: list[str | None] = []
    for result in results:
        assert "crash" not in result, result
        if result["rc"] == 0:  # accepted: at most jobwrap's note on spares without --no-kill
            assert result.get("user_msg", "jobwrap: ").startswith("jobwrap: "), result
            out.append(None)
        else:
            out.append(result["user_msg"])
    return out
