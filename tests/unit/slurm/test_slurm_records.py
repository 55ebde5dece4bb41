"""Slurm records with hostile user text, and host lists, read with bounds (issue 12 item 4).

Records are built as Slurm 22.05's ``scontrol -o show job`` prints them (taken from the
sandbox), with the user's text from hypothesis made of Slurm's own field names, ``=``,
blanks, newlines and brackets: Slurm's real fields must come back exactly as printed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wrapper.errors import SlurmError
from wrapper.slurm.parse import MAX_HOSTS, HostlistError, asks_signal, expand_hostlist
from wrapper.slurm.records import (
    AmbiguousJobName,
    SlurmJob,
    from_json_job,
    from_json_node,
    node_down,
    node_lost,
    node_state,
    parse_gres_gpus,
    parse_job_text,
    slurm_timestamp,
    time_limit_seconds,
)

MIDDLE = [("UserId", "jwtest(1001)"), ("GroupId", "jwtest(1001)"), ("MCS_label", "N/A"),
          ("Priority", "4294901759"), ("Nice", "0"), ("Account", "(null)"), ("QOS", "(null)"),
          ("JobState", "FAILED"), ("Reason", "NonZeroExitCode"), ("Dependency", "(null)"),
          ("Requeue", "1"), ("Restarts", "0"), ("BatchFlag", "1"), ("Reboot", "0"),
          ("ExitCode", "1:0"), ("RunTime", "00:00:01"), ("TimeLimit", "UNLIMITED"),
          ("StartTime", "2026-12-03T09:15:32"), ("Partition", "debug"),
          ("AllocNode:Sid", "localhost:7270"), ("ReqNodeList", "(null)"),
          ("ExcNodeList", "(null)"), ("NodeList", "n1"), ("BatchHost", "n1"),
          ("TRES", "cpu=1,node=1,billing=1"), ("Features", "(null)"),
          ("Licenses", "(null)")]
WORDS = ["JobState=NODE_FAIL", "ExcNodeList=n[0-99999999999]", "UserId=root(0)", "=", " ",
         "\n", "\n   ", "[", "]", "Reason=NodeDown", "Requeue=0", "Restarts=9",
         "ExitCode=0:0", "Command=/x", "WorkDir=/y", "Comment=", "StdOut=/z", "StdErr=",
         "StdIn=", "JobName=", "JobId=7", "Network=", "Power=", "x", "\t"]
hostile = st.lists(st.sampled_from(WORDS), max_size=12).map("".join)


def record(name: str, *, network: str = "(null)", workdir: str = "/w", comment: str | None,
           stdout: str = "/w/slurm-7.out") -> str:
    parts = ["JobId=7", f"JobName={name}", *(f"{k}={v}" for k, v in MIDDLE),
             f"Network={network}", "Command=/w/job.sh", f"WorkDir={workdir}"]
    if comment is not None:
        parts.append(f"Comment={comment} ")
    parts += [f"StdErr={stdout}", "StdIn=/dev/null", f"StdOut={stdout}", "Power=", "\n"]
    return " ".join(parts)


def read(line: str, name: str) -> dict[str, str]:
    """As the backend does: the name is asked for only when the record needs it."""
    try:
        return parse_job_text(line)
    except AmbiguousJobName:
        return parse_job_text(line, name=name)


@settings(max_examples=400)
@given(name=hostile, network=hostile, comment=st.one_of(st.none(), hostile))
def test_user_text_never_becomes_a_field(name: str, network: str, comment: str | None) -> None:
    got = read(record(name, network=network, comment=comment), name)
    for key, value in MIDDLE:
        assert got[key] == value, (key, got)
    assert got["JobId"] == "7" and got["JobName"] == name
    job = SlurmJob.of(got)
    assert (job.state, job.exit_code, job.requeue, job.restarts, job.excluded) == \
        ("FAILED", 1, True, 0, "")


@settings(max_examples=300)
@given(comment=hostile)
def test_a_comment_stays_a_comment(comment: str) -> None:
    got = read(record("train", comment=comment), "train")
    # A comment that names a trailing free-text field may be split at it: those fields
    # are the same user's text and paths, never read for a decision (see records.py).
    assert got["Comment"].strip(" ") == comment.strip(" ") or "StdErr=" in comment \
        or "StdIn=" in comment or "StdOut=" in comment or "Power=" in comment \
        or "Comment=" in comment
    assert got["StdOut"] == "/w/slurm-7.out" or "StdOut=" in comment or "Power=" in comment


def test_the_reported_attack() -> None:
    comment = "x JobState=NODE_FAIL ExcNodeList=n[0-99999999999]"
    got = read(record("job.sh", comment=comment), "job.sh")
    assert (got["JobState"], got["ExcNodeList"], got["Comment"]) == ("FAILED", "(null)",
                                                                    comment)
    assert got["WorkDir"] == "/w" and got["StdOut"] == "/w/slurm-7.out"


def test_a_name_holding_userid_needs_the_name_and_must_match_it() -> None:
    name = "x UserId=root(0) JobState=NODE_FAIL"
    line = record(name, comment=None)
    with pytest.raises(AmbiguousJobName):
        parse_job_text(line)
    assert parse_job_text(line, name=name)["JobState"] == "FAILED"
    with pytest.raises(SlurmError, match="does not match its name"):
        parse_job_text(line, name="y")
    with pytest.raises(SlurmError, match="JobId"):
        parse_job_text("garbage JobState=NODE_FAIL")


def test_array_head_fields() -> None:
    line = record("a", comment=None).replace("JobId=7 ", "JobId=7 ArrayJobId=5 ArrayTaskId=2 ")
    got = parse_job_text(line)
    assert (got["ArrayJobId"], got["ArrayTaskId"], got["JobName"]) == ("5", "2", "a")


def test_json_job_of_new_and_old_slurm() -> None:
    new = {"jobs": [{"job_id": 7, "name": "x JobState=NODE_FAIL", "user_name": "u",
                     "user_id": 1001, "job_state": ["FAILED", "COMPLETING"],
                     "state_reason": "NonZeroExitCode", "requeue": True, "restart_cnt": 2,
                     "exit_code": {"status": ["NONZERO"], "return_code": {"set": True,
                                                                        "number": 3},
                                   "signal": {"id": {"set": False, "number": 0}}},
                     "time_limit": {"set": True, "infinite": False, "number": 90},
                     "start_time": {"set": True, "number": 0}, "excluded_nodes": "",
                     "nodes": "n[1-2]", "comment": "ExcNodeList=n[0-9]",
                     "stdout_expanded": "/w/7.out", "standard_output": "/w/%j.out",
                     "current_working_directory": "/w", "array_job_id": {"set": True,
                                                                         "number": 0}}]}
    got = from_json_job(new)
    assert got["JobState"] == "COMPLETING" and got["ExcNodeList"] == "(null)"
    assert (got["ExitCode"], got["Requeue"], got["Restarts"]) == ("3:0", "1", "2")
    assert (got["TimeLimit"], got["StartTime"], got["StdOut"]) == ("01:30:00", "Unknown",
                                                                  "/w/7.out")
    assert "ArrayJobId" not in got
    old = {"jobs": [{"job_id": 8, "job_state": "FAILED", "exit_code": 256, "requeue": False,
                     "time_limit": 1500, "array_job_id": 5, "array_task_id": 1}]}
    got = from_json_job(old)
    assert (got["JobState"], got["ExitCode"], got["Requeue"], got["TimeLimit"]) == \
        ("FAILED", "1:0", "0", "1-01:00:00")
    assert (got["ArrayJobId"], got["ArrayTaskId"]) == ("5", "1")
    with pytest.raises(SlurmError):
        from_json_job({"jobs": []})


def test_json_node() -> None:
    got = from_json_node({"nodes": [{"name": "n1", "state": ["IDLE", "DRAIN"], "gres": "gpu:4",
                                     "reason": "jobwrap: ecc"}]})
    assert got == {"NodeName": "n1", "State": "IDLE+DRAIN", "Gres": "gpu:4",
                   "Reason": "jobwrap: ecc", "Partitions": "", "SlurmdStartTime": "Unknown",
                   "BootTime": "Unknown"}


# -- a node's Gres -------------------------------------------------------------------------
@pytest.mark.parametrize(("gres", "expected"), [
    ("gpu:4", 4), ("gpu:h100:8(S:0-1)", 8), ("gpu:a100:4(S:0),gpu:a100:4(S:1),shard:16", 8),
    ("(null)", 0), ("", 0), ("gpu", 1), ("gpu:1K", 1024), ("mps:100,gpu:tesla:2", 2),
])
def test_gres_strings_are_counted(gres: str, expected: int) -> None:
    assert parse_gres_gpus(gres) == expected


def test_a_gres_string_that_cannot_be_read() -> None:
    with pytest.raises(ValueError, match="cannot read the gres entry"):
        parse_gres_gpus("gpu:a:b:c")


# -- host lists -----------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "why"), [
    ("n[0-99999999999]", "more than 9 digits"),
    ("n[0-70000]", f"more than {MAX_HOSTS} hosts"),
    ("r[1-300]n[1-300]", f"more than {MAX_HOSTS} hosts"),
    (",".join(f"a[1-{MAX_HOSTS // 2}]" for _ in range(3)), f"more than {MAX_HOSTS} hosts"),
    ("n[[1-2]]", "nested"),
])
def test_huge_or_bad_host_lists_are_refused_clearly(text: str, why: str) -> None:
    with pytest.raises(HostlistError, match=why):
        expand_hostlist(text)


@settings(max_examples=400)
@given(st.lists(st.sampled_from(["n", "gpu-", "[", "]", ",", "-", "0", "1", "9", "05",
                                 "99999999999", "70000", "x"]), max_size=16).map("".join))
def test_any_host_list_is_a_bounded_list_or_a_clear_error(text: str) -> None:
    try:
        names = expand_hostlist(text)
    except HostlistError as exc:
        assert str(exc) and "Traceback" not in str(exc)
        assert isinstance(exc, ValueError) and isinstance(exc, SlurmError)
        return
    assert len(names) <= MAX_HOSTS
    assert all(name and "[" not in name and "]" not in name for name in names)


SLURM25 = Path(__file__).parents[2] / "fixtures" / "slurm25"


def test_json_of_real_slurm_25_11_job() -> None:
    """A real ``scontrol --json show job`` of Slurm 25.11.7 (data_parser v0.0.44), of a
    2-node job with no --output, a --time=7, and job_submit.lua's Extra."""
    got = from_json_job(json.loads((SLURM25 / "job_noout.json").read_text()), "1")
    assert (got["JobId"], got["JobName"], got["UserId"]) == ("1", "noout.sh", "jwtest(1001)")
    assert (got["JobState"], got["Reason"], got["Requeue"], got["Restarts"]) == \
        ("RUNNING", "None", "1", "0")
    assert (got["ExitCode"], got["TimeLimit"], got["NodeList"]) == ("0:0", "00:07:00", "n[1-2]")
    assert got["StdOut"] == "/tmp/jobwrap-sandbox/work/slurm-1.out"  # slurmctld's default
    assert got["WorkDir"] == "/tmp/jobwrap-sandbox/work"
    assert (got["ExcNodeList"], got["Account"]) == ("(null)", "(null)")
    assert got["Extra"] == "jobwrap:1 #JOBWRAP --max-restarts=1"
    # what archive/rerun.py asks for again (a rerun of a 2-node job is a 2-node job)
    assert (got["NumNodes"], got["NumTasks"], got["CPUs/Task"]) == ("2", "2", "1")
    assert got["ReqTRES"] == "cpu=2,mem=4000M,node=2,billing=2"
    assert (got["MinMemoryNode"], got["MinMemoryCPU"], got["QOS"]) == ("0", "", "(null)")
    assert "ArrayJobId" not in got
    job = SlurmJob.of(got)
    assert (job.state, job.requeue, job.exit_code, job.exit_signal) == ("RUNNING", True, 0, 0)


def test_json_of_real_slurm_25_11_array_picks_the_task_asked_for() -> None:
    """25.11 prints every task of the array for ``show job 2_1``, task 2 first."""
    data = json.loads((SLURM25 / "job_array.json").read_text())
    assert len(data["jobs"]) == 2
    first = from_json_job(data, "2_1")
    assert (first["ArrayJobId"], first["ArrayTaskId"]) == ("2", "1")
    assert first["StdOut"] == "/tmp/jobwrap-sandbox/work/o-3.out"  # task 1 is job 3
    second = from_json_job(data, "2")
    assert (second["JobId"], second["ArrayTaskId"], second["Comment"]) == ("2", "2", "x y")
    with pytest.raises(SlurmError, match="no job 2_7"):
        from_json_job(data, "2_7")


def test_json_of_real_slurm_25_11_node() -> None:
    got = from_json_node(json.loads((SLURM25 / "node_completing.json").read_text()))
    from datetime import datetime

    assert got == {"NodeName": "n1", "State": "MIXED+COMPLETING", "Gres": "gpu:4",
                   "Reason": "", "Partitions": "debug",
                   "SlurmdStartTime": datetime.fromtimestamp(1796300725).isoformat(),
                   "BootTime": datetime.fromtimestamp(1796288881).isoformat()}


@pytest.mark.parametrize(("state", "down"), [
    ("DOWN", True), ("DOWN*", True), ("DOWN*+DRAIN", True), ("IDLE*", True),
    ("DOWN+NOT_RESPONDING", True), ("MIXED+NOT_RESPONDING", True), ("down~", True),
    ("IDLE+POWERED_DOWN", False), ("IDLE+CLOUD+POWERED_DOWN", False),
    ("IDLE+POWER_DOWN", False), ("IDLE+POWERING_DOWN", False), ("POWERED_DOWN", False),
    ("POWERING_DOWN+DRAIN", False), ("IDLE+DRAIN", False), ("MIXED", False), ("", False),
])
def test_a_node_is_down_by_its_base_state_or_flag_never_a_part_of_a_word(
        state: str, down: bool) -> None:
    """Slurm's State is a base state and ``+`` flags: a node powered down to save power
    (POWERED_DOWN, POWER_DOWN, POWERING_DOWN) is not DOWN, nor lost."""
    assert node_down({"State": state}) is down
    assert node_lost({"State": state}) is down
    from_json = from_json_node({"nodes": [{"name": "n2", "state": state.split("+")}]})
    assert node_down(from_json) is down


def test_a_node_state_reads_as_its_base_and_its_flags() -> None:
    assert node_state({"State": "IDLE+CLOUD+POWERED_DOWN"}) == (
        "IDLE", frozenset({"CLOUD", "POWERED_DOWN"}))
    assert node_state({"State": "DOWN*+DRAIN"}) == (
        "DOWN", frozenset({"DRAIN", "NOT_RESPONDING"}))
    assert node_state({}) == ("", frozenset())


def test_a_node_that_came_back_during_the_attempt_was_lost() -> None:
    """slurmd (or the node) started again after the attempt began: lost and back, though
    its state is IDLE again; Slurm's times are local, ``Unknown`` is no time."""
    from datetime import datetime

    began = datetime(2026, 12, 3, 15, 0, 0).timestamp()
    back = {"State": "IDLE", "SlurmdStartTime": "2026-12-03T15:01:00", "BootTime": "Unknown"}
    before = {"State": "IDLE", "SlurmdStartTime": "2026-12-03T14:00:00",
              "BootTime": "2026-11-30T08:00:00"}
    assert node_lost(back, began) and not node_lost(back)
    assert not node_lost(before, began)
    assert node_lost({"State": "IDLE", "BootTime": "2026-12-03T15:00:05"}, began)
    assert not node_lost({"State": "IDLE", "SlurmdStartTime": "soon"}, began)
    assert slurm_timestamp("2026-12-03T15:01:00") == began + 60
    assert slurm_timestamp("Unknown") is None and slurm_timestamp("") is None
    fields = from_json_node({"nodes": [{"name": "n2", "state": ["IDLE"],
                                        "slurmd_start_time": {"set": True, "number": 60},
                                        "boot_time": 0}]})
    assert fields["SlurmdStartTime"] == datetime.fromtimestamp(60).isoformat()
    assert fields["BootTime"] == "Unknown"


@pytest.mark.parametrize(("text", "seconds"), [
    ("UNLIMITED", None), ("Partition_Limit", None), ("", None), ("soon", None),
    ("30:00", 1800.0), ("01:30:00", 5400.0), ("1-02:00:00", 93600.0),
    ("365-00:00:00", 365 * 86400.0)])
def test_a_time_limit_as_slurm_prints_it(text: str, seconds: float | None) -> None:
    assert time_limit_seconds(text) == seconds


def test_a_started_time_with_blanks_around_it_is_still_a_time() -> None:
    assert slurm_timestamp(" 2026-12-03T15:01:00\n") == slurm_timestamp("2026-12-03T15:01:00")
    assert slurm_timestamp("None") is None


def test_only_an_sbatch_line_asks_for_a_signal() -> None:
    assert asks_signal("#!/bin/bash\n#SBATCH -N 1 --signal=USR1@90\nsrun x\n")
    assert asks_signal("#!/bin/bash\n#SBATCH --signal B:USR1@60\n")
    assert not asks_signal("#!/bin/bash\n# SBATCH --signal=USR1@90\nsrun --signal=USR1 x\n")
