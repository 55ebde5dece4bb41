"""job_submit.lua under a real Lua interpreter, as slurmctld's job_submit/lua calls it:
directive rules, requeue, the pre-timeout signal, site defaults and its own failures."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.lua import luarun
from tests.fixtures.lua.directive_table import ROWS, STAGE_ROWS, script_of
from wrapper.submit.lua import SiteDefaults, render

ALL_ROWS = ROWS + STAGE_ROWS
SLURM_ERROR = -1
SUCCESS = 0
NO_VAL16 = luarun.NO_VAL16
PLAIN = "#!/bin/bash\n#SBATCH --time=10\nsrun python train.py\n"


@pytest.fixture(scope="module", params=luarun.interpreter_params())
def lua(request: pytest.FixtureRequest) -> str:
    return luarun.require(request.param)


@pytest.fixture(scope="module")
def table_results(lua: str, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    cases = [luarun.submit_case(script_of(lines)) for lines, _ in ALL_ROWS]
    return luarun.run_cases(cases, tmp_path_factory.mktemp("lua-table"), lua=lua)


def _run(lua: str, tmp_path: Path, cases: list[dict[str, Any]],
         site: SiteDefaults | None = None) -> list[dict[str, Any]]:
    plugin = luarun.PLUGIN
    if site is not None:
        plugin = tmp_path / "job_submit.lua"
        plugin.write_text(render(site))
    return luarun.run_cases(cases, tmp_path, lua=lua, plugin=plugin)


def _one(lua: str, tmp_path: Path, case: dict[str, Any],
         site: SiteDefaults | None = None) -> dict[str, Any]:
    return _run(lua, tmp_path, [case], site)[0]


@pytest.mark.parametrize("index", range(len(ALL_ROWS)),
                         ids=[lines.replace("\n", "|")[:60] for lines, _ in ALL_ROWS])
def test_directive_rules(table_results: list[dict[str, Any]], index: int) -> None:
    phrase = ALL_ROWS[index][1]
    result = table_results[index]
    assert "crash" not in result
    if phrase is None:
        assert result["rc"] == SUCCESS, result.get("user_msg")
        assert "user_msg" not in result
    else:
        assert result["rc"] == SLURM_ERROR
        assert phrase in result["user_msg"]
        assert result["user_msg"].startswith("#JOBWRAP line ")
        # A refused job is left as it came: nothing set on it.
        assert "set" not in result


def test_refusal_is_logged_for_the_admin(table_results: list[dict[str, Any]]) -> None:
    index = next(i for i, (_, phrase) in enumerate(ALL_ROWS) if phrase)
    info = [text for level, text in table_results[index]["logs"] if level == "info"]
    assert any("refused a job of uid 1000" in text for text in info)


def test_a_percent_sign_in_the_message_is_not_a_format(lua: str, tmp_path: Path) -> None:
    # slurm.log_user formats like string.format: the plugin must pass "%s", message.
    result = _one(lua, tmp_path, luarun.submit_case(script_of("#JOBWRAP --x%d%s%%")))
    assert result["user_msg"].startswith("#JOBWRAP line 2: unknown option '--x%d%s%%'")


REQUEUE_CASES: list[tuple[str, str, dict[str, Any], int | None]] = [
    # (what, script, job fields, requeue the plugin sets; None: leaves it alone)
    ("unset: made requeueable", PLAIN, {}, 1),
    ("field absent: made requeueable", PLAIN, {"requeue": None}, 1),
    ("sbatch --no-requeue (0) is respected", PLAIN, {"requeue": 0}, None),
    ("sbatch --requeue (1) is kept", PLAIN, {"requeue": 1}, None),
    ("#JOBWRAP --no-requeue", script_of("#JOBWRAP --no-requeue"), {}, 0),
    ("#JOBWRAP --no-requeue beats --requeue", script_of("#JOBWRAP --no-requeue"),
     {"requeue": 1}, 0),
    ("#SBATCH --no-requeue, not seen by sbatch", script_of("#SBATCH -N 2 --no-requeue"), {}, 0),
    ("#SBATCH --no-requeue then --requeue", script_of("#SBATCH --no-requeue\n#SBATCH --requeue"),
     {}, 1),
    ("#SBATCH --no-requeue after the first command",
     "#!/bin/sh\ntrue\n#SBATCH --no-requeue\n", {}, 1),
    ("--max-restarts=0: no restarts, no requeue", script_of("#JOBWRAP --max-restarts=0"), {},
     None),
    ("--max-restarts=2", script_of("#JOBWRAP --max-restarts=2"), {}, 1),
]


@pytest.mark.parametrize(("what", "script", "fields", "expected"), REQUEUE_CASES,
                         ids=[c[0] for c in REQUEUE_CASES])
def test_requeue(lua: str, tmp_path: Path, what: str, script: str, fields: dict[str, Any],
                 expected: int | None) -> None:
    case = luarun.submit_case(script, **fields)
    case["fields"] = {k: v for k, v in case["fields"].items() if v is not None}
    result = _one(lua, tmp_path, case)
    assert result["rc"] == SUCCESS
    assert result.get("set", {}).get("requeue") == expected


def test_no_signal_fields_in_slurm_22_05_so_none_are_set(lua: str, tmp_path: Path) -> None:
    # 22.05's plugin knows no warn_* field: setting one would log "unrecognized field".
    result = _one(lua, tmp_path, luarun.submit_case(PLAIN))
    assert result["rc"] == SUCCESS
    assert result["unrecognized"] == []
    assert not {"warn_signal", "warn_time", "warn_flags"} & set(result.get("set", {}))
    debug = " ".join(text for level, text in result["logs"] if level == "debug")
    assert "pre-timeout signal: left to the supervisor" in debug


@pytest.mark.parametrize(("current", "expected"), [
    (NO_VAL16, {"warn_signal": 23, "warn_time": 300, "warn_flags": 0}),
    (0, {"warn_signal": 23, "warn_time": 300, "warn_flags": 0}),
    (12, {}),  # the job's own --signal
])
def test_signal_where_the_plugin_exposes_it(lua: str, tmp_path: Path, current: int,
                                            expected: dict[str, int]) -> None:
    case = luarun.submit_case(PLAIN, warn_signal=current, warn_time=NO_VAL16)
    case["warn_fields"] = True
    result = _one(lua, tmp_path, case)
    assert result["rc"] == SUCCESS
    sets = result.get("set", {})
    assert {k: v for k, v in sets.items() if k.startswith("warn_")} == expected


def test_site_signal_and_lead(lua: str, tmp_path: Path) -> None:
    site = SiteDefaults(signal_name="USR2", signal_number=12, signal_lead=120)
    case = luarun.submit_case(PLAIN, warn_signal=NO_VAL16)
    case["warn_fields"] = True
    result = _one(lua, tmp_path, case, site)
    assert result["set"]["warn_signal"] == 12
    assert result["set"]["warn_time"] == 120


def test_site_signal_off(lua: str, tmp_path: Path) -> None:
    case = luarun.submit_case(PLAIN, warn_signal=NO_VAL16)
    case["warn_fields"] = True
    result = _one(lua, tmp_path, case, SiteDefaults(signal_lead=0))
    assert "warn_signal" not in result.get("set", {})
    assert result["set"]["requeue"] == 1


def test_site_without_restarts_leaves_requeue_alone(lua: str, tmp_path: Path) -> None:
    site = SiteDefaults(max_restarts=0)
    plain, asks = _run(lua, tmp_path, [
        luarun.submit_case(PLAIN),
        luarun.submit_case(script_of("#JOBWRAP --max-restarts=2")),
    ], site)
    assert "set" not in plain
    assert asks["set"]["requeue"] == 1


def test_site_that_only_checks(lua: str, tmp_path: Path) -> None:
    site = SiteDefaults(requeue=False)
    ok, bad = _run(lua, tmp_path, [
        luarun.submit_case(PLAIN),
        luarun.submit_case(script_of("#JOBWRAP --bogus")),
    ], site)
    assert ok["rc"] == SUCCESS and "set" not in ok
    assert bad["rc"] == SLURM_ERROR


def test_site_restart_limit(lua: str, tmp_path: Path) -> None:
    site = SiteDefaults(max_restarts_limit=2)
    within, over = _run(lua, tmp_path, [
        luarun.submit_case(script_of("#JOBWRAP --max-restarts=2")),
        luarun.submit_case(script_of("#SBATCH -N1\n#JOBWRAP --max-restarts 007")),
    ], site)
    assert within["rc"] == SUCCESS
    assert over["rc"] == SLURM_ERROR
    assert over["user_msg"] == ("#JOBWRAP line 3: --max-restarts='007': this cluster allows "
                                "at most 2 restarts")


def test_jobs_without_a_batch_script_are_untouched(lua: str, tmp_path: Path) -> None:
    result = _one(lua, tmp_path, luarun.submit_case(None))  # srun / salloc
    assert result["rc"] == SUCCESS
    assert "set" not in result and "user_msg" not in result


def test_an_internal_error_accepts_the_job_and_says_so(lua: str, tmp_path: Path) -> None:
    case = luarun.submit_case(None)
    case["fields"]["script"] = 42  # not a string: the plugin's own code fails on it
    result = _one(lua, tmp_path, case)
    assert "crash" not in result
    assert result["rc"] == SUCCESS
    errors = [text for level, text in result["logs"] if level == "error"]
    assert errors and "internal error, job accepted unchecked" in errors[0]


def test_modify_accepts(lua: str, tmp_path: Path) -> None:
    case = luarun.submit_case(None, time_limit=120)
    case["call"] = "modify"
    result = _one(lua, tmp_path, case)
    assert result["rc"] == SUCCESS and "set" not in result


def test_the_file_loads_and_returns_success(table_results: list[dict[str, Any]]) -> None:
    assert all(r["load_rc"] == SUCCESS for r in table_results)


def test_debians_plugin_lua_is_among_the_tested() -> None:
    """Where Slurm's plugin is installed, the Lua it links is one these tests run under."""
    plugin = Path("/usr/lib/x86_64-linux-gnu/slurm-wlm/job_submit_lua.so")
    ldd = shutil.which("ldd")
    assert ldd, "ldd is missing"
    if not plugin.exists():  # no Slurm here: nothing to match; the other tests still ran
        assert luarun.interpreter_params() != ["missing"]
        return
    out = subprocess.run([ldd, str(plugin)], capture_output=True, text=True, check=True).stdout
    version = re.search(r"liblua-?(5\.\d)", out)
    assert version, out
    tested = {Path(p).name.removeprefix("lua") for p in luarun.interpreter_params()}
    assert version.group(1) in tested, (
        f"job_submit_lua.so links Lua {version.group(1)}; apt-get install -y "
        f"lua{version.group(1)} so the plugin is tested under it")


# -- the directives every node's prolog reads from SLURM_JOB_EXTRA (Slurm 23.02+) ---------
def _ctx_of(extra: str) -> Any:
    from wrapper.slurm.context import from_env

    return from_env("prolog", {"SLURM_JOB_ID": "5", "SLURMD_NODENAME": "n1",
                               "SLURM_JOB_EXTRA": extra})


def test_directives_kept_in_extra_parse_as_the_script_does(lua: str, tmp_path: Path) -> None:
    from wrapper.slurm.context import known_script
    from wrapper.submit.directives import parse_script

    script = ("#!/bin/bash\n#SBATCH --signal=USR2@60\n#JOBWRAP --checkpoint-dir='my ckpt' "
              "--max-restarts=2\n#JOBWRAPPER not ours\n#JOBWRAP --stage-in=/data/s\u00e9t:set"
              "\t--hang-timeout=1h\nsrun x\n#JOBWRAP --max-restarts=9\n")
    result = _one(lua, tmp_path, luarun.submit_case(script))
    assert result["rc"] == SUCCESS
    extra = result["extra"]
    assert extra.startswith("jobwrap:1 ") and "\n" not in extra and "\t" not in extra
    kept = known_script(_ctx_of(extra))
    assert kept is not None and "#SBATCH --signal=USR2@60" in kept
    assert "JOBWRAPPER" not in kept and "srun" not in kept
    assert parse_script(kept) == parse_script(script)


def test_the_jobs_own_extra_is_left_alone(lua: str, tmp_path: Path) -> None:
    from wrapper.slurm.context import known_script

    mine = _one(lua, tmp_path, luarun.submit_case(PLAIN, extra="rack=7"))
    assert "extra" not in mine
    assert known_script(_ctx_of("rack=7")) is None
    forged = _one(lua, tmp_path, luarun.submit_case(PLAIN, extra="jobwrap:1 #JOBWRAP --x"))
    assert forged["extra"] == "jobwrap:1 "  # the script's own (none), not the forgery


def test_a_long_header_leaves_the_prolog_to_read_the_script(lua: str, tmp_path: Path) -> None:
    script = "#!/bin/bash\n" + "#JOBWRAP --checkpoint-glob=" + "x" * 5000 + "\nsrun x\n"
    result = _one(lua, tmp_path, luarun.submit_case(script))
    assert result["rc"] == SUCCESS and result["extra"] == ""


# Partitions as job_submit/lua hands them: flags bit 0 marks the default one.
PARTS = {"debug": {"flags": 1, "total_nodes": 3, "max_nodes": 4294967295},
         "small": {"flags": 0, "total_nodes": 8, "max_nodes": 2}}
SPARE = "#!/bin/bash\n#SBATCH -N2{sbatch}\n#JOBWRAP --spare-nodes={n}\nsrun python t.py\n"


def _spare_case(n: int = 1, sbatch: str = "", **fields: Any) -> dict[str, Any]:
    job = {"min_nodes": 2, "max_nodes": 2, **fields}
    return {**luarun.submit_case(SPARE.format(n=n, sbatch=sbatch), **job), "part_list": PARTS}


def test_spare_nodes_come_on_top_of_the_jobs_nodes(lua: str, tmp_path: Path) -> None:
    plain, no_kill, tasks = _run(lua, tmp_path, [
        _spare_case(), _spare_case(sbatch=" --no-kill"), _spare_case(num_tasks=8)])
    assert plain["rc"] == SUCCESS and (plain["set"]["min_nodes"], plain["set"]["max_nodes"]) \
        == (3, 3)
    # without --no-kill a node Slurm loses ends the job: said at submit, accepted
    assert "add #SBATCH --no-kill" in plain["user_msg"]
    assert no_kill["rc"] == SUCCESS and "user_msg" not in no_kill
    assert tasks["set"]["num_tasks"] == 12  # 4 tasks per node, on 3 nodes


@pytest.mark.parametrize(("case", "phrase"), [
    (_spare_case(min_nodes=4294967294, max_nodes=4294967294), "needs a fixed node count"),
    (_spare_case(max_nodes=4), "needs a fixed node count"),
    (_spare_case(2), "do not fit in partition debug, which has 3 nodes"),
    (_spare_case(1, partition="small"), "than partition small allows a job (MaxNodes=2)"),
    (_spare_case(num_tasks=3), "3 tasks do not spread evenly over 2 nodes"),
])
def test_spare_nodes_a_job_cannot_have_are_refused_with_the_reason(
        lua: str, tmp_path: Path, case: dict[str, Any], phrase: str) -> None:
    result = _one(lua, tmp_path, case)
    assert result["rc"] == SLURM_ERROR, result
    assert result["user_msg"].startswith("#JOBWRAP line 3: --spare-nodes=")
    assert phrase in result["user_msg"], result["user_msg"]
    assert "set" not in result


def test_the_sites_default_spares_reach_jobwrap_in_the_extra(lua: str, tmp_path: Path) -> None:
    site = SiteDefaults(spare_nodes="debug=1")
    plain = {**luarun.submit_case(PLAIN, min_nodes=2, max_nodes=2), "part_list": PARTS}
    other = {**luarun.submit_case(PLAIN, min_nodes=2, max_nodes=2, partition="small"),
             "part_list": PARTS}
    too_big = {**luarun.submit_case(PLAIN, min_nodes=3, max_nodes=3), "part_list": PARTS}
    asked_none = {**_spare_case(0)}
    got, elsewhere, unfit, zero = _run(lua, tmp_path, [plain, other, too_big, asked_none],
                                       site)
    assert got["rc"] == SUCCESS and got["set"]["min_nodes"] == 3
    assert "#JOBWRAP --spare-nodes=1" in got["extra"]
    assert elsewhere["rc"] == SUCCESS and "min_nodes" not in elsewhere.get("set", {})
    # the site's default never refuses a job: one it does not fit gets none
    assert unfit["rc"] == SUCCESS and "min_nodes" not in unfit.get("set", {})
    assert "spare-nodes" not in unfit.get("extra", "")
    assert zero["rc"] == SUCCESS and "min_nodes" not in zero.get("set", {})
